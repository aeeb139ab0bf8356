"""megatron-core's parallel layouts on the CPU over gloo, end to end through the CLI.

Equivalent layouts of the same seed train the same model on the same data, so their loss
series match a one-process run within fp32 rounding (the CPU path draws weights
layout-invariantly, kit.engines.megatron.seeded_init). A data-parallel run's step loss is the
mean of its replicas' losses.
"""

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kit.bundle.verify import verify_bundle

from .conftest import bundle_path, losses_by_rank, why_failed

pytestmark = pytest.mark.training  # every test here starts ranks (pyproject.toml: tiers)

# fp32 rounding differs between layouts (reduction order); a layout bug moves the loss far more
# (the gloo batch_p2p_comm swap under interleaved PP changes the first loss by 1.5e-4).
REL = 1e-5


def run_ok(cli, tmp_path: Path, *args: str) -> Path:
    r = cli("run", *args, "--steps", "2", "--warmup", "1", "--out", str(tmp_path))
    assert r.returncode == 0, why_failed(r)
    bundle = bundle_path(r.stdout)
    verify_bundle(bundle)
    return bundle


def reference(bundle: Path, steps: int = 3) -> list[float]:
    return losses_by_rank(bundle)[0][:steps]


def test_tp2_with_sequence_parallel_matches_one_process(cli, tmp_path, gpt3_tiny_reference):
    losses = losses_by_rank(run_ok(cli, tmp_path, "gpt3-tiny", "--tp", "2", "--sp"))
    assert losses[0] == losses[1]
    assert losses[0] == pytest.approx(reference(gpt3_tiny_reference), rel=REL)


def test_pp2_1f1b_with_full_block_recompute_matches_one_process(
    cli, tmp_path, gpt3_tiny_reference
):
    bundle = run_ok(cli, tmp_path, "gpt3-tiny", "--pp", "2", "--recompute", "full",
                    "--recompute-method", "block")
    losses = losses_by_rank(bundle)
    assert losses[0] == [None] * 3  # the first stage computes no loss
    assert losses[1] == pytest.approx(reference(gpt3_tiny_reference), rel=REL)
    rows = pq.read_table(bundle / "steps.parquet").to_pylist()
    assert {(r["rank"], r["stage"]) for r in rows} == {(0, 0), (1, 1)}
    m = json.loads((bundle / "manifest.json").read_text())
    assert [x["stage"] for x in m["ranks"]] == [0, 1]


def test_interleaved_pp_matches_one_process_and_times_each_stage(
    cli, tmp_path, gpt3_tiny_reference
):
    """PP2 x VPP2 over gloo: the p2p batching trap would swap activations and gradients."""
    bundle = run_ok(cli, tmp_path, "gpt3-tiny", "--pp", "2", "--vpp", "2")
    assert losses_by_rank(bundle)[1] == pytest.approx(reference(gpt3_tiny_reference), rel=REL)
    per_rank = json.loads((bundle / "metrics.json").read_text())["per_rank"]
    assert [r["stage"] for r in per_rank] == [0, 1]
    for r in per_rank:
        phases = r["phase_time_s"]
        assert set(phases) == {"forward_s", "backward_s", "pipeline_p2p_s", "grad_sync_s",
                               "optimizer_s"}
        assert phases["forward_s"] > 0 and phases["backward_s"] > 0
        assert phases["pipeline_p2p_s"] > 0 and phases["optimizer_s"] > 0
    shown = cli("bundle", "show", str(bundle))
    assert shown.returncode == 0, shown.stderr
    table = shown.stdout[shown.stdout.index("stage    ranks"):].splitlines()
    assert "forward    backward    pipeline_p2p    grad_sync    optimizer" in table[0]
    for stage, row in enumerate(table[2:4]):
        cells = row.split()
        assert cells[:2] == [str(stage), "1"] and all(float(c) > 0 for c in cells[2:4])


def test_dp2_distributed_optimizer_with_overlap_matches_one_process(
    cli, tmp_path, gpt3_tiny_reference
):
    bundle = run_ok(cli, tmp_path, "gpt3-tiny", "--dp", "2", "--dist-optimizer", "--overlap")
    losses = losses_by_rank(bundle)
    assert losses[0] != losses[1]  # replicas see different data
    mean = [(a + b) / 2 for a, b in zip(losses[0], losses[1], strict=True)]
    assert mean == pytest.approx(reference(gpt3_tiny_reference), rel=REL)


@pytest.fixture(scope="module")
def fsdp_dp2_many_steps(tmp_path_factory) -> Path:
    """DP2 Megatron-FSDP, 80 measured steps: one run for the two tests below. Its first three
    losses are those of a 2-step run (the schedule does not depend on --steps), so it is also
    the parity run (a separate 2-step run cost a start-up of its own)."""
    from .conftest import kit_cli

    r = kit_cli("run", "gpt3-tiny", "--dp", "2", "--fsdp", "--steps", "80", "--warmup", "1",
                "--out", str(tmp_path_factory.mktemp("fsdp-dp2")))
    assert r.returncode == 0, why_failed(r)
    bundle = bundle_path(r.stdout)
    verify_bundle(bundle)
    return bundle


def test_dp2_megatron_fsdp_matches_one_process(fsdp_dp2_many_steps, gpt3_tiny_reference):
    """megatron-core's Megatron-FSDP shards weights, grads and Adam states yet trains the same
    model as plain data parallel (whose replica mean is the one-process run)."""
    bundle = fsdp_dp2_many_steps
    losses = {rank: series[:3] for rank, series in losses_by_rank(bundle).items()}
    mean = [(a + b) / 2 for a, b in zip(losses[0], losses[1], strict=True)]
    assert mean == pytest.approx(reference(gpt3_tiny_reference), rel=REL)
    notes = json.loads((bundle / "metrics.json").read_text())["notes"]
    assert any("Megatron-FSDP" in n for n in notes)


def test_tp2_dp2_megatron_fsdp_with_overlap_matches_one_process(
    cli, tmp_path, gpt3_tiny_reference
):
    """FSDP over DP with TP inside each replica; on CPU its parameter all-gathers are
    synchronous, and the notes say so."""
    bundle = run_ok(cli, tmp_path, "gpt3-tiny", "--tp", "2", "--dp", "2", "--fsdp", "--overlap")
    losses = losses_by_rank(bundle)
    assert losses[0] == losses[1] and losses[2] == losses[3]  # TP peers share a replica's loss
    mean = [(a + b) / 2 for a, b in zip(losses[0], losses[2], strict=True)]
    assert mean == pytest.approx(reference(gpt3_tiny_reference), rel=REL)
    notes = json.loads((bundle / "metrics.json").read_text())["notes"]
    assert any(n.startswith("data parallel: megatron-core Megatron-FSDP")
               and "on cpu its parameter all-gathers are synchronous" in n for n in notes), notes


def test_megatron_fsdp_survives_many_steps_over_gloo(fsdp_dp2_many_steps):
    """With Megatron-FSDP's asynchronous gloo all-gathers a rank's heap was corrupted (SIGABRT,
    "malloc(): unaligned tcache chunk detected") within 60 steps in most runs; the CPU path
    gathers synchronously (kit.engines.megatron.cpu_compat)."""
    losses = losses_by_rank(fsdp_dp2_many_steps)
    assert all(len(x) == 81 and all(math.isfinite(v) for v in x) for x in losses.values())


@pytest.fixture(scope="module")
def mixtral_dp2(tmp_path_factory) -> Path:
    from .conftest import kit_cli

    return run_ok(kit_cli, tmp_path_factory.mktemp("mixtral-dp2"), "mixtral-tiny", "--dp", "2")


def test_moe_trains_data_parallel(mixtral_dp2):
    losses = losses_by_rank(mixtral_dp2)
    assert losses[0] != losses[1] and all(math.isfinite(x) for x in losses[0] + losses[1])


def test_ep2_allgather_matches_ep1_alltoall(cli, tmp_path, mixtral_dp2):
    """Experts split over two ranks (allgather dispatcher) train the same model as EP 1."""
    bundle = run_ok(cli, tmp_path, "mixtral-tiny", "--dp", "2", "--ep", "2",
                    "--moe-dispatcher", "allgather")
    m = json.loads((bundle / "metrics.json").read_text())
    assert [r["ep_rank"] for r in m["per_rank"]] == [0, 1]
    ep2, ep1 = losses_by_rank(bundle), losses_by_rank(mixtral_dp2)
    for rank in (0, 1):
        assert ep2[rank] == pytest.approx(ep1[rank], rel=REL)


def test_full_recompute_with_sequence_parallel_matches_one_process(
    cli, tmp_path, gpt3_tiny_reference
):
    """Recomputation's backward replays the SP gathers on the CPU too (torch 2.13 made
    ``torch.autograd.backward``, which megatron's ``CheckpointFunction`` calls, overridable)."""
    bundle = run_ok(cli, tmp_path, "gpt3-tiny", "--tp", "2", "--sp", "--recompute", "full")
    losses = losses_by_rank(bundle)
    assert losses[0] == losses[1]
    assert losses[0] == pytest.approx(reference(gpt3_tiny_reference), rel=REL)


def test_full_recompute_of_the_alltoall_dispatcher_matches_ep1(cli, tmp_path, mixtral_dp2):
    """The MoE all-to-all, replayed inside recomputation's backward, stays on the CPU."""
    bundle = run_ok(cli, tmp_path, "mixtral-tiny", "--dp", "2", "--ep", "2",
                    "--recompute", "full")
    ep2, ep1 = losses_by_rank(bundle), losses_by_rank(mixtral_dp2)
    for rank in (0, 1):
        assert ep2[rank] == pytest.approx(ep1[rank], rel=REL)


@pytest.mark.parametrize(("flag", "why"), [
    (["--dp", "2", "--pp", "2", "--fsdp"], "no pipeline dimension"),
    (["--cp", "2", "--engine", "deepspeed"], "no context parallelism"),
])
def test_a_cpu_layout_nothing_can_run_is_refused(cli, tmp_path, flag, why):
    r = cli("run", "gpt3-tiny", *flag, "--steps", "1", "--out", str(tmp_path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0]
    assert not any(tmp_path.iterdir())  # no rank started, no bundle


def test_four_ranks_tp2_sp_ep2_dp2_distributed_optimizer_matches_ep1(cli, tmp_path, mixtral_dp2):
    """MoE under TP + SP, alltoall dispatcher: its uneven token all-gathers run over gloo."""
    bundle = run_ok(cli, tmp_path, "mixtral-tiny", "--tp", "2", "--sp", "--dp", "2", "--ep", "2",
                    "--dist-optimizer")
    tp_ep, ep1 = losses_by_rank(bundle), losses_by_rank(mixtral_dp2)
    assert tp_ep[0] == tp_ep[1] and tp_ep[2] == tp_ep[3]  # TP peers share a replica's loss
    assert tp_ep[0] == pytest.approx(ep1[0], rel=REL)
    assert tp_ep[2] == pytest.approx(ep1[1], rel=REL)


def test_cp2_under_pp2_matches_one_process(cli, tmp_path, gpt3_tiny_reference):
    """Context parallelism (all-gathered keys and values, chunks r and 2cp-1-r) under 1F1B."""
    bundle = run_ok(cli, tmp_path, "gpt3-tiny", "--cp", "2", "--pp", "2")
    m = json.loads((bundle / "metrics.json").read_text())
    assert [(r["pp_rank"], r["cp_rank"]) for r in m["per_rank"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    losses = losses_by_rank(bundle)
    assert losses[0] == losses[1] == [None] * 3  # the first stage computes no loss
    assert losses[2] == losses[3]  # CP peers report the whole sequence's loss
    assert losses[2] == pytest.approx(reference(gpt3_tiny_reference), rel=REL)


def test_cp2_dp2_moe_matches_dp2(cli, tmp_path, mixtral_dp2):
    """CP with RoPE, grouped-query attention and MoE. The router's auxiliary loss makes the
    training loss's scale visible under Adam: without dividing the loss by the CP size
    (megatron's schedule multiplies it back) two of the three steps differ by more than REL."""
    bundle = run_ok(cli, tmp_path, "mixtral-tiny", "--cp", "2", "--dp", "2")
    cp, dp = losses_by_rank(bundle), losses_by_rank(mixtral_dp2)
    assert cp[0] == cp[1] and cp[2] == cp[3]
    assert cp[0] == pytest.approx(dp[0], rel=REL)
    assert cp[2] == pytest.approx(dp[1], rel=REL)
