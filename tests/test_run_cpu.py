"""Real training runs on the CPU over gloo: megatron-core TP and TP x DP, end to end via the CLI.

The other parallel layouts: tests/test_megatron_parallel_cpu.py.
"""

import json
import math
import os
import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kit.bundle.reader import read_bundle
from kit.bundle.schema import SUMMARY_KEYS
from kit.bundle.verify import verify_bundle

from .conftest import (
    bundle_path,
    losses_by_rank,
    rank_pid,
    start_long_run,
    wait_for_steps,
)

pytestmark = pytest.mark.training  # every test here starts ranks (pyproject.toml: tiers)


def test_tp2_trains_and_writes_a_verifiable_bundle(cpu_run):
    bundle, r = cpu_run
    assert "step time" in r.stdout and "MFU" in r.stdout and "n/a" in r.stdout
    assert "step 5/5" in r.stderr  # progress was shown
    verify_bundle(bundle)
    b = read_bundle(bundle)
    assert b.manifest.status == "ok" and b.manifest.error is None
    assert set(b.metrics.summary) == set(SUMMARY_KEYS)
    s = b.metrics.summary
    assert s["world_size"] == 2 and s["step_time_s"] > 0 and s["tokens_per_s"] > 0
    assert s["tflops_per_gpu"] > 0 and s["mfu"] is None  # the cpu platform declares no peak
    assert s["power_w_mean"] is None  # no RAPL here, and never a made-up zero
    src = b.manifest.telemetry_sources
    assert src["cpu_util_pct"].source == "host" and src["power_w"].source is None
    assert src["power_w"].reason
    assert [rk.tp_rank for rk in b.manifest.ranks] == [0, 1]
    assert b.manifest.inventory[0].engine_versions["megatron-core"].startswith("0.")


def test_tp_ranks_report_identical_losses(cpu_run):
    losses = losses_by_rank(cpu_run[0])
    assert losses[0] == losses[1]
    assert all(math.isfinite(x) for x in losses[0]) and len(losses[0]) == 5


def test_steps_have_synchronized_measured_rows(cpu_run):
    rows = pq.read_table(cpu_run[0] / "steps.parquet").to_pylist()
    measured = [r for r in rows if r["phase"] == "measured"]
    assert len(measured) == 4 * 2 and {r["step"] for r in measured} == {1, 2, 3, 4}
    for step in {r["step"] for r in measured}:
        starts = [r["t_start"] for r in measured if r["step"] == step]
        assert max(starts) - min(starts) < 0.5  # ranks start each step together
    tele = pq.read_table(cpu_run[0] / "telemetry.parquet").to_pylist()
    assert tele and all(t["source"] == "host" for t in tele)
    # a tick with no CPU time elapsed since the last one has no utilization (null, not 0)
    assert sum(t["cpu_util_pct"] is not None for t in tele) >= 0.8 * len(tele)
    first, last = min(r["t_start"] for r in rows), max(r["t_end"] for r in rows)
    assert min(t["t"] for t in tele) < first and max(t["t"] for t in tele) > last


def test_tp2_matches_tp1_loss(cpu_run, gpt3_tiny_reference):
    """TP shards the same model: the loss of each step matches a one-process run (fp32)."""
    tp1 = losses_by_rank(gpt3_tiny_reference)[0]
    tp2 = losses_by_rank(cpu_run[0])[0]
    assert tp1 == pytest.approx(tp2, rel=1e-4)


def test_tp2_dp2_runs_four_ranks(tp2_dp2_bundle):
    bundle = tp2_dp2_bundle
    verify_bundle(bundle)
    m = json.loads((bundle / "manifest.json").read_text())
    assert [(x["tp_rank"], x["dp_rank"]) for x in m["ranks"]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    per_rank = json.loads((bundle / "metrics.json").read_text())["per_rank"]
    keys = ("tp_rank", "pp_rank", "dp_rank", "cp_rank", "ep_rank")
    # the layout the manifest records is the one the engine reported from inside each rank
    assert [{k: x[k] for k in keys} for x in m["ranks"]] == [{k: x[k] for k in keys}
                                                              for x in per_rank]
    losses = losses_by_rank(bundle)
    assert losses[0] == losses[1] and losses[2] == losses[3]
    assert losses[0] != losses[2]  # data-parallel replicas see different data
    assert sorted(p.name for p in (bundle / "logs").iterdir()) == [f"rank{i}.log" for i in range(4)]


def test_sigterm_ends_with_interrupted_and_a_complete_bundle(tmp_path):
    proc = start_long_run(tmp_path)
    wait_for_steps(tmp_path, 3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    bundle = bundle_path(out)
    verify_bundle(bundle)
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["status"] == "interrupted" and "signal" in m["error"]
    assert {x["status"] for x in m["ranks"]} == {"interrupted"}
    losses = losses_by_rank(bundle)
    assert 3 <= len(losses[0]) < 501 and len(losses[0]) == len(losses[1])


@pytest.mark.timeout(300)
def test_a_killed_rank_is_blamed_not_the_peer_it_broke(tmp_path):
    """SIGKILL rank 1 of a DP 2 run: rank 0's collective then breaks, but the headline is the
    first rank to end (rank 1, by signal), as torchrun reports it; each record keeps its own."""
    proc = start_long_run(tmp_path, "--dp", "2")
    wait_for_steps(tmp_path, 2, rank=1)  # the victim's own records (on a busy host it lags)
    victim = rank_pid(proc.pid, rank=1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    bundle = bundle_path(out)
    verify_bundle(bundle)
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["status"] == "failed"
    assert m["error"].startswith("rank 1: killed by SIGKILL, the first rank to end; last log line:")
    killed, peer = m["ranks"][1], m["ranks"][0]
    assert (killed["status"], killed["signal"], killed["exit_code"]) == ("failed", "SIGKILL", None)
    assert killed["dp_rank"] == 1 and peer["dp_rank"] == 0  # from the layout, not its result
    assert killed["log_tail"] and killed["log_tail"][-1].startswith("rank 1: step ")
    assert peer["status"] == "failed" and peer["exit_code"] == 1 and peer["error"]  # secondary
    # The steps both ranks ran before the kill are in the bundle, the killed rank's included
    # (streamed as they ended, not only written at exit).
    losses = losses_by_rank(bundle)
    assert len(losses[1]) >= 2 and len(losses[0]) >= len(losses[1]) - 1


def test_an_exception_in_a_rank_is_recorded(cli, tmp_path):
    """A workload megatron-core rejects at build time (RoPE needs an even head dim)."""
    wl = tmp_path / "odd-rope.yaml"
    wl.write_text(
        "family: llama3\nnum_layers: 2\nhidden_size: 66\nnum_attention_heads: 2\n"
        "ffn_hidden_size: 128\nseq_length: 16\nvocab_size: 256\nactivation: swiglu\n"
        "normalization: rmsnorm\nposition_embedding: rope\nadd_bias_linear: false\n"
        "tie_embeddings: false\nglobal_batch_size: 2\n"
    )
    r = cli("run", str(wl), "--steps", "2", "--warmup", "0", "--out", str(tmp_path / "out"),
            "--json")
    assert r.returncode == 1
    printed = json.loads(r.stdout)  # --json: status, error, bundle and summary as one object
    bundle = Path(printed["bundle"])
    verify_bundle(bundle)
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["status"] == printed["status"] == "failed" and m["error"].startswith("rank 0: ")
    assert printed["error"] == m["error"] and "step_time_s" in printed["summary"]
    assert "Traceback" in (bundle / "logs" / "rank0.log").read_text()
