"""Per-expert token counts of MoE runs: counted by the engine, kept in the bundle, summarized
in metrics.json and drawn by ``report`` (mixtral-tiny, EP2 over gloo, real processes)."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kit.bundle.schema import EXPERTS_SCHEMA
from kit.bundle.verify import verify_bundle
from kit.errors import BundleError
from kit.metrics.expert_load import expert_load_summary, experts_rows

from .conftest import bundle_path, why_failed


@pytest.fixture(scope="module")
def ep2(tmp_path_factory) -> Path:
    """EP2 x DP2, alltoall dispatcher."""
    from .conftest import kit_cli

    out = tmp_path_factory.mktemp("ep2")
    r = kit_cli("run", "mixtral-tiny", "--dp", "2", "--ep", "2", "--steps", "2", "--warmup", "1",
                "--out", str(out))
    assert r.returncode == 0, why_failed(r)
    bundle = bundle_path(r.stdout)
    verify_bundle(bundle)
    return bundle


@pytest.mark.training
@pytest.mark.timeout(600)
def test_every_token_is_counted_once_per_chosen_expert(ep2):
    rows = pq.read_table(ep2 / "experts.parquet")
    assert rows.schema.equals(EXPERTS_SCHEMA)
    rows = rows.to_pylist()
    cfg = json.loads((ep2 / "manifest.json").read_text())["config"]
    w = cfg["workload"]
    assert {r["step"] for r in rows} == {0, 1, 2}
    assert {r["layer"] for r in rows} == set(range(1, w["num_layers"] + 1))
    assert {r["expert"] for r in rows} == set(range(w["num_experts"]))
    per_rank_tokens = cfg["global_batch_size"] // cfg["parallel"]["dp"] * w["seq_length"]
    for step in range(3):
        for layer in range(1, w["num_layers"] + 1):
            for rank in (0, 1):  # each replica's tokens, top-k experts each, counted once
                got = sum(r["tokens"] for r in rows if (r["step"], r["layer"], r["rank"])
                          == (step, layer, rank))
                assert got == per_rank_tokens * w["moe_top_k"]
    phases = {r["step"]: r["phase"] for r in rows}
    assert phases == {0: "warmup", 1: "measured", 2: "measured"}


@pytest.mark.training
@pytest.mark.timeout(600)
def test_imbalance_summary_and_report_figure(ep2, cli, tmp_path):
    load = json.loads((ep2 / "metrics.json").read_text())["expert_load"]
    assert (load["experts"], load["layers"], load["top_k"], load["ep"]) == (4, 2, 2, 2)
    assert load["measured_steps"] == 2
    assert 1.0 <= load["max_over_mean"] <= load["max_over_mean_worst"] <= 4.0
    assert 1.0 <= load["ep_max_over_mean"] <= load["ep_max_over_mean_worst"] <= 2.0
    assert 0.0 <= load["cv"] <= load["cv_worst"]
    for layer in load["per_layer"]:
        assert sum(layer["tokens_frac"]) == pytest.approx(1.0, abs=1e-3)
    out = tmp_path / "r.html"
    r = cli("report", str(ep2), "-o", str(out))
    assert r.returncode == 0, why_failed(r)
    html = out.read_text()
    assert 'id="expert-load-1"' in html and "Tokens each expert received" in html


@pytest.mark.training
@pytest.mark.timeout(600)
def test_full_recompute_counts_each_micro_batch_once(cli, tmp_path):
    # the router runs twice per micro-batch (forward without autograd, then again in backward)
    r = cli("run", "mixtral-tiny", "--recompute", "full", "--steps", "1", "--warmup", "0",
            "--out", str(tmp_path))
    assert r.returncode == 0, why_failed(r)
    rows = pq.read_table(bundle_path(r.stdout) / "experts.parquet").to_pylist()
    for layer in (1, 2):  # global batch 8 x 128 tokens, top-2
        assert sum(x["tokens"] for x in rows if x["layer"] == layer) == 8 * 128 * 2


@pytest.mark.training
@pytest.mark.timeout(600)
def test_capacity_padded_routing_counts_kept_tokens_and_reports_drops(ep2, cli, tmp_path):
    # --moe-capacity 1.0: the study's routing, each expert's input padded to an even share
    r = cli("run", "mixtral-tiny", "--moe-capacity", "1.0", "--steps", "2", "--warmup", "1",
            "--out", str(tmp_path))
    assert r.returncode == 0, why_failed(r)
    bundle = bundle_path(r.stdout)
    workload = json.loads((bundle / "manifest.json").read_text())["workload"]
    assert (workload["moe_capacity_factor"], workload["moe_pad_to_capacity"]) == (1.0, True)
    rows = pq.read_table(bundle / "experts.parquet").to_pylist()
    routed = 8 * 128 * 2  # global batch 8 x 128 tokens, top-2, per layer and step
    capacity = 8 * 128 * 2 // 4  # capacity factor 1.0: an even share of 4 experts
    for step in (0, 1, 2):
        for layer in (1, 2):
            kept = [x["tokens"] for x in rows if (x["step"], x["layer"]) == (step, layer)]
            assert max(kept) <= capacity and sum(kept) < routed  # some expert was over it
    load = json.loads((bundle / "metrics.json").read_text())["expert_load"]
    assert [s for s, _ in load["dropped_frac_by_step"]] == [1, 2]
    assert 0 < load["dropped_frac"] <= load["dropped_frac_worst"] < 0.5
    dropless = json.loads((ep2 / "metrics.json").read_text())["expert_load"]
    assert dropless["dropped_frac"] == 0 and dropless["dropped_frac_worst"] == 0


def test_moe_capacity_is_refused_where_it_cannot_apply(cli):
    dense = cli("run", "gpt3-tiny", "--moe-capacity", "1.0", "--dry-run")
    assert dense.returncode == 2
    assert dense.stderr.strip() == ("error: --moe-capacity: gpt3-tiny is not a "
                                    "mixture-of-experts workload")
    for bad in ("0", "nan", "inf", "lots"):
        r = cli("run", "mixtral-tiny", "--moe-capacity", bad, "--dry-run")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "neither none nor a capacity factor in (0, 64]" in r.stderr
    dropless = cli("run", "mixtral-8x7b-4l", "--platform", "h200", "--moe-capacity", "none",
                   "--dry-run", "--json")
    assert dropless.returncode == 0, dropless.stderr
    plan = json.loads(dropless.stdout)
    assert plan["workload"]["moe_capacity_factor"] is None
    assert plan["execution"]["eager_because"] == ["mixture of experts with dropless routing"]
    padded = cli("run", "mixtral-8x7b-4l", "--platform", "h200", "--dry-run", "--json")
    assert json.loads(padded.stdout)["execution"] == {"mode": "graphed", "eager_because": []}


def test_summary_figures_from_known_counts():
    # two ranks, one layer, 4 experts over 2 EP ranks; measured step 1 only
    counts = {0: [10, 0, 5, 5], 1: [10, 10, 0, 0]}
    table = experts_rows([(0, 0, "warmup", {"1": [99, 0, 0, 0]}),
                          *[(1, rank, "measured", {"1": c}) for rank, c in counts.items()]])
    s = expert_load_summary(table, top_k=2, ep=2)
    # per expert [20, 10, 5, 5]: mean 10, max 20, population std sqrt(37.5)
    assert s["max_over_mean"] == 2.0 and s["cv"] == pytest.approx(37.5 ** 0.5 / 10, abs=1e-4)
    assert s["ep_max_over_mean"] == pytest.approx(30 / 20)  # EP ranks get 30 and 10
    assert s["per_layer"][0]["tokens_frac"] == [0.5, 0.25, 0.125, 0.125]
    assert expert_load_summary(None, top_k=2, ep=1) == {}
    # 2 ranks x 10 tokens x top-2 = 40 slots routed; 40 counted: nothing dropped
    assert expert_load_summary(table, top_k=2, ep=2, tokens_per_step=20)["dropped_frac"] == 0
    dropped = expert_load_summary(table, top_k=2, ep=2, tokens_per_step=25)
    assert dropped["dropped_frac_by_step"] == [[1, 0.2]]  # 40 of 50 slots kept


@pytest.mark.training
def test_a_corrupt_experts_file_fails_verification(ep2, tmp_path):
    import shutil

    copy = tmp_path / ep2.name
    shutil.copytree(ep2, copy)
    bad = pa.table({"step": pa.array([0], pa.int32())})
    pq.write_table(bad, copy / "experts.parquet")
    with pytest.raises(BundleError, match="experts.parquet"):
        verify_bundle(copy)
