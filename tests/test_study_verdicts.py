"""Each finding compares like with like: a confounded pair, an absent factor, a clean agree and
a clean disagree, from recorded bundles.

The facts are read from real bundles recorded on one H100 and one H200 (tests/data/bundles).
Where a case needs a property no recorded bundle has (a graphed step beside an eager one, a
second data-parallel replica, another GPU utilization), the facts of a recorded bundle are
changed in the fields the case names, through the public constructor
(``dataclasses.replace``), and each test's docstring says which. Cases built from whole
derived bundles (micro-batch sweeps, four GPUs' temperatures) are in tests/test_study.py; the
CPU-made cases run ``study --from`` there.
"""
# ruff: noqa: D103  (test names say what they check)

from dataclasses import replace
from pathlib import Path

import pytest

from kit.engines.execution import Execution
from kit.study.facts import BundleFacts, read_facts
from kit.study.likeness import GPU_UTIL_GAP_PCT, Held, differences
from kit.study.render import findings_html, findings_json, findings_markdown, write_figures
from kit.study.verdicts import (
    HELD,
    microbatch_bursts,
    overlap_power,
    recompute_power,
    scale_up,
    tp_pp_links,
)

REPO = Path(__file__).resolve().parent.parent
PARALLEL = REPO / "tests/data/bundles/parallel"
OFF = read_facts(PARALLEL / "20261124T201036Z-mixtral-8x7b-4l-h200-4a76f4")
"""Mixtral 8x7B (4 layers) on one H200, eager (MoE), recomputation none, 74% GPU utilization."""
ON = read_facts(PARALLEL / "20261124T201141Z-mixtral-8x7b-4l-h200-588d9e")
"""The same run with full recomputation: eager, 71% GPU utilization."""
TELEMETRY = REPO / "tests/data/bundles/telemetry"
H100 = read_facts(TELEMETRY / "20261125T122448Z-gpt3-1.3b-h100-f4a12c")
H200 = read_facts(TELEMETRY / "20261122T094842Z-gpt3-1.3b-h200-bceb8a")


def _power(f: BundleFacts, factor: float) -> BundleFacts:
    """``f`` with its mean power scaled by ``factor``."""
    return replace(f, summary={**f.summary, "power_w_mean": f.summary["power_w_mean"] * factor})


# --- recompute-power ---------------------------------------------------------------------------

def test_recompute_clean_pair_disagrees_on_the_recorded_runs():
    result = recompute_power([OFF, ON])
    assert result.verdict == "disagrees", result.why
    assert result.differs == []
    assert result.plot is not None and result.plot.y_label == "change with full recomputation on"
    assert set(result.plot.series) == {"mean power (%)", "hottest GPU (deg C)"}
    assert result.plot.samples["mean power (%)"] == [205]  # the recorded runs' power samples


def test_recompute_clean_pair_agrees_when_power_moves():
    """The recompute-on run's mean power set 10% lower (summary.power_w_mean)."""
    result = recompute_power([OFF, _power(ON, 0.9)])
    assert result.verdict == "agrees", result.why
    assert "mean power -12" in result.why


def test_recompute_pair_that_left_the_graph_is_confounded():
    """Issue 58's pair: the recompute-off run's execution set to graphed (the recorded one ran
    eager), so recomputation also switched the step to the eager path."""
    graphed = replace(OFF, execution=Execution("graphed"))
    result = recompute_power([graphed, _power(ON, 0.93)])
    assert result.verdict == "confounded", result.why
    assert [d.setting for d in result.differs] == ["execution"]
    assert "execution mode: graphed" in result.why and "eager (mixture of experts; activation " \
        "recomputation)" in result.why
    assert "not evidence" in result.why
    entry = result.as_json()
    assert entry["verdict"] == "confounded" and entry["differs"][0]["setting"] == "execution"
    assert entry["factor"] == ["recompute", "recompute_method"]
    assert "execution" in entry["held_fixed"]


def test_recompute_pair_with_a_starved_gpu_is_confounded_by_how_much():
    """The recompute-on run's GPU utilization set to 60% (recorded: 71%), 14 points below the
    off run's 74%."""
    result = recompute_power([OFF, replace(ON, gpu_util_pct=60.0)])
    assert result.verdict == "confounded", result.why
    (diff,) = result.differs
    assert diff.setting == "host_bound" and diff.what == "GPU utilization"
    assert "14 points apart" in diff.by and f"more than {GPU_UTIL_GAP_PCT:.0f}" in diff.by
    # the recorded pair itself is 4 points apart: within the gap
    assert differences([OFF, ON], HELD["recompute-power"]) == []


def test_recompute_prefers_a_clean_pair_to_a_confounded_one():
    """A second recompute-on run with another kit version (kit_version) beside the clean one."""
    other = replace(_power(ON, 0.5), name="other-kit", kit_version="0.2.0 (abcdef0)")
    result = recompute_power([OFF, ON, other])
    assert result.verdict == "disagrees", result.why
    assert "other-kit" not in result.bundles


def test_recompute_off_everywhere_is_not_measurable():
    result = recompute_power([OFF])
    assert result.verdict == "not measurable here"
    assert "on in no run: the factor is absent" in result.why


# --- overlap-power -----------------------------------------------------------------------------

def _dp2(f: BundleFacts, overlap: bool) -> BundleFacts:
    """``f`` as a DP2 run (parallel.dp, world_size) with overlap as given (overlap)."""
    return replace(f, parallel={**f.parallel, "dp": 2}, world_size=2, overlap=overlap,
                   optim={**f.optim, "overlap": overlap})


def test_overlap_on_one_replica_has_nothing_to_overlap():
    """The recorded recompute-off run with overlap set on (overlap): TP1 x PP1 x DP1, as in
    issue 58's one-H100 study, which read this pair as a disagreement."""
    on = replace(OFF, name="overlap-on", overlap=True, optim={**OFF.optim, "overlap": True})
    result = overlap_power([OFF, on])
    assert result.verdict == "not measurable here", result.why
    assert "one data-parallel replica" in result.why and "factor is absent" in result.why
    assert result.plot is None


def test_overlap_clean_pairs_agree_and_disagree_on_power():
    """Both sides made DP2 (see _dp2); the overlap-on side's mean power changed for the agree."""
    off, on = _dp2(OFF, False), replace(_dp2(OFF, True), name="overlap-on")
    assert overlap_power([off, on]).verdict == "disagrees"
    moved = overlap_power([off, _power(on, 1.08)])
    assert moved.verdict == "agrees", moved.why
    assert moved.evidence["pairs"][0]["exposed_comm_s_per_step"] == [None, None]


def test_overlap_pair_of_two_kit_versions_is_confounded():
    """DP2 pair (see _dp2), the overlap-on side's kit_version changed."""
    off = _dp2(OFF, False)
    on = replace(_dp2(OFF, True), name="overlap-on", kit_version="0.1.0 (1da354b)")
    result = overlap_power([off, _power(on, 1.08)])
    assert result.verdict == "confounded", result.why
    assert [d.setting for d in result.differs] == ["kit_version"]
    assert "0.1.0 (022df2b)" in result.why and "0.1.0 (1da354b)" in result.why


def test_overlap_must_move_the_exposed_communication_where_profiled():
    """DP2 pair (see _dp2) with profile figures set (exposed_comm_s, idle_share): overlap that
    leaves the exposed communication where it was hid nothing; one that halves it did."""
    off = replace(_dp2(OFF, False), exposed_comm_s=0.100, idle_share=0.05)
    on = replace(_dp2(OFF, True), name="overlap-on", exposed_comm_s=0.098, idle_share=0.05)
    still = overlap_power([off, _power(on, 1.08)])
    assert still.verdict == "not measurable here", still.why
    assert "100.0 -> 98.0 ms" in still.why and "hid nothing" in still.why
    hidden = overlap_power([off, _power(replace(on, exposed_comm_s=0.05), 1.08)])
    assert hidden.verdict == "agrees", hidden.why
    assert hidden.evidence["pairs"][0]["exposed_comm_s_per_step"] == [0.1, 0.05]
    idle = overlap_power([off, _power(replace(on, exposed_comm_s=0.05, idle_share=0.3), 1.08)])
    assert idle.verdict == "confounded" and "idle share of profiled steps" in idle.why


# --- microbatch-bursts -------------------------------------------------------------------------

def _mb(f: BundleFacts, mb: int, ptm: float, util: float) -> BundleFacts:
    """``f`` at micro-batch ``mb`` of global batch 16 (micro_batch_size, global_batch_size),
    its GPU's peak-to-mean ``ptm`` (devices) and utilization ``util`` (gpu_util_pct)."""
    return replace(f, name=f"mb{mb}", micro_batch_size=mb, global_batch_size=16,
                   devices=[{**f.devices[0], "peak_to_mean": ptm}], gpu_util_pct=util)


def test_burst_sweep_from_host_bound_to_device_bound_is_confounded():
    """Issue 58's sweep on one H100: micro-batch 1 at 65% GPU utilization, 8 at 97% (fields as
    in _mb)."""
    result = microbatch_bursts([_mb(H100, 1, 1.20, 65.0), _mb(H100, 8, 1.22, 97.0)])
    assert result.verdict == "confounded", result.why
    assert "GPU utilization: 65% (mb1) vs 97% (mb8), 32 points apart" in result.why
    assert result.plot.y_label == "worst-GPU peak-to-mean power"
    samples = H100.devices[0]["samples"]  # the recorded run's power samples
    assert result.plot.samples["global batch 16 (count falls)"] == [samples, samples]


def test_burst_sweep_alike_in_boundness_is_judged():
    """As the confounded sweep, both at 96-97% GPU utilization (fields as in _mb)."""
    result = microbatch_bursts([_mb(H100, 1, 1.20, 96.0), _mb(H100, 8, 1.22, 97.0)])
    assert result.verdict == "disagrees", result.why
    assert result.differs == []


def test_burst_with_one_micro_batch_is_not_measurable():
    result = microbatch_bursts([H100, H200])
    assert result.verdict == "not measurable here"
    assert result.plot is None


# --- tp-pp-links and scale-up ------------------------------------------------------------------

def _layout(f: BundleFacts, name: str, tp: int, pp: int, gbps: float) -> BundleFacts:
    """``f`` as a 4-GPU layout (parallel, world_size) with link rates (link_gbps,
    link_readings)."""
    return replace(f, name=name, parallel={**f.parallel, "tp": tp, "pp": pp}, world_size=4,
                   link_gbps={d: gbps for d in range(4)}, link_readings={d: 50 for d in range(4)})


def test_links_compare_like_with_like():
    """TP4 and TP2 x PP2 made from the recorded H100 run (fields as in _layout); the confounded
    case's TP x PP run has speed features changed (speed_features)."""
    tp4, tppp = _layout(H100, "tp4", 4, 1, 60.0), _layout(H100, "tp2pp2", 2, 2, 18.0)
    clean = tp_pp_links([tp4, tppp])
    assert clean.verdict == "agrees", clean.why
    assert clean.plot.samples == {"link rate": [50, 50]}
    assert tp_pp_links([tp4, _layout(H100, "tp2pp2", 2, 2, 55.0)]).verdict == "disagrees"
    fewer = replace(tppp, speed_features=("fusions",))
    confounded = tp_pp_links([tp4, fewer])
    assert confounded.verdict == "confounded"
    assert "speed features" in confounded.why


def test_scale_up_across_kit_versions_is_confounded():
    """The recorded H100 and H200 runs made multi-node (nodes, world_size): 2 H200 nodes (16
    GPUs) against 4 H100 nodes (32). They were recorded by different kit commits; the clean
    cases give the H200 run the H100 run's kit_version, and for the agree 1.2 times the H100
    run's throughput (summary.tokens_per_s; recorded: 53559 against 58797 tokens/s)."""
    up = replace(H200, nodes=2, world_size=16)
    out = replace(H100, nodes=4, world_size=32)
    result = scale_up([up, out])
    assert result.verdict == "confounded", result.why
    assert [d.setting for d in result.differs] == ["kit_version"]
    assert "0.1.0 (9394953)" in result.why
    same = replace(up, kit_version=H100.kit_version)
    slower = scale_up([same, out])
    assert slower.verdict == "disagrees" and slower.differs == [], slower.why
    faster = replace(same, summary={**same.summary,
                                    "tokens_per_s": 1.2 * H100.summary["tokens_per_s"]})
    assert scale_up([faster, out]).verdict == "agrees"


# --- the likeness check and the report ---------------------------------------------------------

def test_held_refuses_an_unknown_setting():
    with pytest.raises(ValueError, match="layout"):
        Held(frozenset({"layout"}))


def test_unrecorded_execution_differs_from_a_recorded_one():
    """The H200 bundle predates the speed-features note: its mode is unrecorded (execution)."""
    assert H200.execution is None and H100.execution == Execution("graphed")
    diffs = differences([H100, replace(H200, platform="h100")], Held(frozenset()))
    assert "execution mode: graphed" in "; ".join(d.describe() for d in diffs)
    assert "unrecorded" in "; ".join(d.describe() for d in diffs)


def test_report_shows_confounded_in_its_colour_without_a_figure(tmp_path):
    """The confounded recompute pair (see test_recompute_pair_that_left_the_graph_is_confounded)
    beside the clean one."""
    confounded = recompute_power([replace(OFF, execution=Execution("graphed")), ON])
    clean = recompute_power([OFF, ON])
    figures = write_figures([confounded, clean], tmp_path)
    assert list(figures) == ["recompute-power"] and len(list(tmp_path.iterdir())) == 1
    page = findings_html([confounded], {})
    assert 'style="color:#a2145a">confounded' in page
    assert "Differs beyond the factor" in page and "<img" not in page
    assert "No figure: under a confounded verdict" in page
    text = findings_markdown([confounded], {}, {ON.name: "checksum mismatch"})
    assert "**Unverified:** rests on " + ON.name in text
    doc = findings_json([confounded], "h200x1", {ON.name: "checksum mismatch"})
    assert doc["unverified"] == {ON.name: "checksum mismatch"}
    assert doc["findings"][0]["unverified_bundles"] == [ON.name]
