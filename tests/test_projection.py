"""`charllm-kit project` on the recorded GPU bundles: the model's arithmetic, hand-checked.

The inputs are the committed real bundles: gpt3-1.3b on one H100 (tests/data/bundles/telemetry,
CUDA-graph step, power-capped, no profile) and mixtral-8x7b-4l on one H200
(tests/data/bundles/parallel, eager step, full recompute). Nothing is invented: the figures a
test compares with are those bundles' own, or sizes worked out by hand from the workload.
"""

import json

import pytest

from kit.bundle.reader import read_bundle
from kit.config.loader import load_platform, load_workload
from kit.metrics.flops import model_flops_per_step
from kit.projection.compute import layer_and_logits_flops
from kit.projection.model import project
from kit.projection.network import place
from kit.projection.request import ProjectionTarget, plan_target
from kit.projection.volumes import stage_collectives

from .conftest import REPO, bundle_path, kit_cli, why_failed

H100 = REPO / "tests/data/bundles/telemetry/20261125T122448Z-gpt3-1.3b-h100-f4a12c"
MIXTRAL_FULL = REPO / "tests/data/bundles/parallel/20261124T201141Z-mixtral-8x7b-4l-h200-588d9e"
MIXTRAL_NONE = REPO / "tests/data/bundles/parallel/20261124T201036Z-mixtral-8x7b-4l-h200-4a76f4"


def _h100_target(**fields):
    return ProjectionTarget(micro_batch_size=fields.pop("micro_batch_size", 2),
                            global_batch_size=16, **fields)


def test_the_h100_run_projected_to_its_own_layout_gives_back_its_step_mfu_and_power():
    p = project([H100], _h100_target(devices_per_node=1, micro_batch_size=4), ["test"])
    s = read_bundle(H100).metrics.summary
    assert p.summary["step_time_s"] == pytest.approx(s["step_time_s"], rel=1e-9)
    assert p.summary["mfu"] == pytest.approx(s["mfu"], rel=1e-9)
    assert p.summary["power_w_mean"] == pytest.approx(s["power_w_mean"], rel=1e-9)
    assert p.summary["power_w_peak"] == s["power_w_peak"]
    low, point, high = p.interval["step_time_s"]
    assert low <= s["step_time_s"] <= high
    # energy: mean power x step over the step's tokens; the bundle's own figure is the
    # hardware counter's, which the 20 ms power samples track within a few percent
    tokens = 16 * 2048
    assert p.summary["energy_j_per_token"] == pytest.approx(
        s["power_w_mean"] * s["step_time_s"] / tokens, rel=1e-9)
    assert p.summary["energy_j_per_token"] == pytest.approx(s["energy_j_per_token"], rel=0.05)
    # the platform's GEMM table (platforms/h100.gemm.json) is listed, unused: no profile
    assert p.projected is True and [(i.bundle, i.role) for i in p.inputs[1:]] == [
        ("h100.gemm.json", "unused")] and p.inputs[0].role == "compute"


def test_gpt3_1_3b_tp2_sp_collectives_have_the_hand_computed_sizes_and_counts():
    cfg = plan_target(_h100_target(tp=2, sp=True, devices_per_node=4),
                      load_workload("gpt3-1.3b"), load_platform("h100")).cfg
    assert (cfg.parallel.dp, cfg.grad_accum_steps) == (2, 4)
    got = {c.what: c for c in stage_collectives(cfg, 0)}
    act = 2 * 2048 * 2048 * 2  # micro-batch x sequence x hidden x 2 bytes (bf16): 16 MiB
    assert (got["SP all-gather"].size_bytes, got["SP all-gather"].calls) == (act, 24 * 6)
    assert (got["SP reduce-scatter"].size_bytes, got["SP reduce-scatter"].calls) == (act, 24 * 4)
    # parameters of one TP rank: per layer 2 LayerNorms (2 x 2h), QKV + projection weights
    # 4h^2/2 with biases 3h/2 + h, MLP 2hf/2 with biases f/2 + h; 24 layers; the embedding
    # (vocabulary 50257 padded to 50432 for TP2) split in two, positions 2048 x h, final norm
    h, f = 2048, 8192
    layer = 2 * 2 * h + (4 * h * h // 2 + 3 * h // 2 + h) + (2 * h * f // 2 + f // 2 + h)
    params = 24 * layer + 50432 * h // 2 + 2048 * h + 2 * h
    assert params == 660_287_488
    dp = got["DP gradient all-reduce"]
    assert (dp.size_bytes, dp.calls, dp.scope, dp.group) == (params * 4, 1, "step", "dp")
    assert got["cross-entropy maximum all-reduce"].size_bytes == 2 * 2048 * 4
    assert "PP activation/gradient exchange" not in got


def test_pipeline_stages_follow_1f1b_and_the_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    p = project([H100], _h100_target(pp=4, devices_per_node=4), ["test"])
    m, stages = p.step["micro_batches"], p.stages
    assert m == 8 and p.step["bubble_frac_analytical"] == pytest.approx(3 / 11)
    t = [s.micro_batch_s[1] for s in stages]
    assert p.step["pipeline_s"][1] == pytest.approx(m * max(t) + sum(t) - max(t))
    # stages 0..2 hold 6 layers each, the last also the logits: its compute is larger by the
    # logits' FLOPs at the measured rate
    layer, logits = layer_and_logits_flops(plan_target(
        _h100_target(pp=4, devices_per_node=4), load_workload("gpt3-1.3b"),
        load_platform("h100")).cfg)
    assert stages[3].compute_s / stages[0].compute_s == pytest.approx(
        (6 * layer + logits) / (6 * layer))
    exchange = [c for c in p.collectives if c.what == "PP activation/gradient exchange"]
    assert [c.calls for c in exchange] == [1, 2, 2, 1]
    assert {c.size_bytes for c in exchange} == {2 * 2048 * 2048 * 2}


def test_depth_scaling_keeps_the_measured_time_per_layer():
    target = ProjectionTarget(workload="mixtral-8x7b", micro_batch_size=1, global_batch_size=8,
                              recompute="full")
    p = project([MIXTRAL_FULL, MIXTRAL_NONE], target, ["test"])
    roles = [i.role for i in p.inputs]
    assert roles[:2] == ["compute", "unused"]  # full recompute, as the target
    # the platform's GEMM table (platforms/h200.gemm.json), once, and unused: no profile
    assert [i.bundle for i in p.inputs[2:]] == ["h200.gemm.json"] and roles[2:] == ["unused"]
    run = read_bundle(MIXTRAL_FULL)
    wl = load_workload("mixtral-8x7b")
    full = model_flops_per_step(wl, 1)
    cut = model_flops_per_step(wl.model_copy(update={"num_layers": 4}), 1)
    # no profile: the measured step counts as compute, scaled by the FLOPs of 32 vs 4 layers
    measured = run.metrics.summary["step_time_s"]
    assert p.stages[0].compute_s * 8 == pytest.approx(measured * full / cut, rel=0.02)
    assert any("depth: 4 measured layers scaled to 32" in a for a in p.assumptions)
    assert p.memory["fits"] is False and p.notes[-1].startswith("predicted not to fit")


def test_a_group_across_nodes_runs_at_the_platforms_inter_node_bandwidth_per_member():
    target = _h100_target(tp=8, sp=True, nodes=2, micro_batch_size=4)
    p = project([H100], target, ["test"])
    dp = next(c for c in p.collectives if c.what == "DP gradient all-reduce")
    assert (dp.group_size, dp.members_per_node, dp.nodes) == (2, 1, 2)
    # all-reduce over 2 ranks: bus factor 2(2-1)/2 = 1, busbw 50 GB/s (h100.yaml, one NIC)
    assert dp.time_s[1] == pytest.approx(dp.size_bytes / 50e9)
    tp = next(c for c in p.collectives if c.what == "SP all-gather")
    assert (tp.group_size, tp.nodes) == (8, 1)
    # inside the node: the platform's 450 GB/s NVLink figure, bus factor 7/8, 144 calls
    assert tp.time_s[1] == pytest.approx(144 * tp.size_bytes * 7 / 8 / 450e9)
    cfg = plan_target(target, load_workload("gpt3-1.3b"), load_platform("h100")).cfg
    assert place(cfg, "dp").nodes == 2 and place(cfg, "tp").nodes == 1


def test_projected_energy_and_mfu_follow_from_the_projected_step():
    p = project([H100], _h100_target(dp=4, devices_per_node=4), ["test"])
    s, cfg = p.summary, p.config
    tokens = 16 * 2048
    flops = model_flops_per_step(load_workload("gpt3-1.3b"), 16, 1)
    assert s["tokens_per_s"] == pytest.approx(tokens / s["step_time_s"])
    assert s["mfu"] == pytest.approx(flops / s["step_time_s"] / 4 / 989e12)
    assert s["world_size"] == 4 and cfg["parallel"]["dp"] == 4
    for key in ("step_time_s", "mfu", "power_w_mean", "energy_j_per_token"):
        low, point, high = p.interval[key]
        assert low <= point <= high and s[key] == point
    assert p.power["idle_w"] < p.power["compute_w"]
    # each GPU's step energy splits into compute, communication and idle at their powers
    st = p.stages[0]
    compute_s = p.step["micro_batches"] * st.compute_s + st.optimizer_s
    comm_s = p.step["micro_batches"] * st.blocking_comm_s[1] + (st.tail_s[1] - st.optimizer_s)
    idle_s = s["step_time_s"] - compute_s - comm_s
    energy = compute_s * p.power["compute_w"] + comm_s * p.power["comm_w"] \
        + idle_s * p.power["idle_w"]
    assert s["energy_j_per_token"] == pytest.approx(energy * 4 / tokens)


def test_compare_and_report_show_a_projection_beside_the_run_marked_projected(tmp_path):
    r = kit_cli("project", str(H100), "--devices-per-node", "4", "--dp", "4",
                "--micro-batch", "2", "--global-batch", "16", "--out", str(tmp_path))
    assert r.returncode == 0, why_failed(r)
    assert r.stdout.startswith("PROJECTED")
    proj = bundle_path(r.stdout)
    assert proj.name.endswith(".projection.json") and proj.parent == tmp_path
    r = kit_cli("compare", str(H100), str(proj))
    assert r.returncode == 0, r.stderr
    assert "PROJECTED" in r.stdout and "[projected]" in r.stdout
    assert f"{proj.name} is PROJECTED, not measured" in r.stdout
    data = json.loads(kit_cli("compare", str(H100), str(proj), "--format", "json").stdout)
    measured, projected = data["groups"]
    assert (measured["projected"], projected["projected"]) == (False, True)
    assert [i["bundle"] for i in projected["inputs"]] == [H100.name, "h100.gemm.json"]
    step = projected["metrics"]["step_time_s"]
    saved = json.loads(proj.read_text())["interval"]["step_time_s"]
    assert [step["min"], step["median"], step["max"]] == saved
    report = tmp_path / "r.html"
    r = kit_cli("report", str(H100), str(proj), "-o", str(report))
    assert r.returncode == 0, r.stderr
    page = report.read_text()
    assert "PROJECTED" in page and f"input (compute)</dt><dd>{H100.name}" in page
    assert 'id="power-timeline-2"' not in page  # a projection has no telemetry to draw


@pytest.mark.parametrize("args, needle", [
    ([str(H100), "--tp", "3", "--devices-per-node", "4"], "tp x pp x cp (3) must divide"),
    ([str(H100), "--devices-per-node", "9"], "--devices-per-node 9: platform h100 has 8"),
    ([str(H100), "--workload", "llama3-8b"], "no measured run of llama3-8b's architecture"),
    ([str(REPO / "tests/data/bundles/20261122T094016Z-gpt3-1.3b-h100-e955a2")],
     "pcie_tx_bytes"),
    (["/nonexistent"], "no bundle at /nonexistent"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, tmp_path):
    r = kit_cli("project", *args, "--out", str(tmp_path))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []

