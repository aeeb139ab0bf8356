"""What the report says across configurations, on real CPU runs of several layouts: a line of
the sweep figure joins only runs alike in all but the swept parameter (kit.analysis.sweep_series),
a study finding's figure stands only under a verdict it is evidence for (plots_findings), and
what a sweep varies on purpose is said as its axes, not flagged (kit.analysis.comparability).
"""
# ruff: noqa: D103  (test names say what they check)

import html
import json
import re
import shutil
from pathlib import Path

import pytest

from kit.analysis.comparability import execution_mode
from kit.analysis.compare import Comparison, compare_bundles
from kit.analysis.plots_findings import finding_figure
from kit.analysis.plots_study import sweep_lines
from kit.analysis.sweep_series import find_sweep, world_size
from kit.bundle.writer import write_sums
from kit.study.facts import read_facts
from kit.study.run import conclude
from kit.study.verdicts import Plot, all_findings, microbatch_bursts

from .conftest import REPO, bundle_path, kit_cli, why_failed

pytestmark = pytest.mark.training

SHORT = ("--steps", "2", "--warmup", "1", "--telemetry-interval-ms", "0")
SWEEP = """name: batches
base: {workload: gpt3-tiny, platform: cpu, steps: 2, warmup: 1, telemetry_interval_ms: 0}
axes:
  - zip: {micro_batch_size: [1, 2], global_batch_size: [4, 8]}
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory, gpt3_tiny_reference, cpu_bundle, tp2_dp2_bundle) -> dict[str, Path]:
    """gpt3-tiny on cpu at micro-batch 2 and global batch 8: ``tp1`` (1 rank), ``tp2`` (2
    ranks) and ``tp2dp2`` (4 ranks), the session's; made here, ``dp2`` (2 ranks) and ``mb1``,
    ``mb4`` (1 rank, micro-batch 1 and 4)."""
    out = tmp_path_factory.mktemp("sweep-runs")
    made = {}
    for name, args in {"dp2": ("--dp", "2"), "mb1": ("--micro-batch", "1"),
                       "mb4": ("--micro-batch", "4")}.items():
        r = kit_cli("run", "gpt3-tiny", *args, *SHORT, "--out", str(out / name))
        assert r.returncode == 0, why_failed(r)
        made[name] = bundle_path(r.stdout)
    return {"tp1": gpt3_tiny_reference, "tp2": cpu_bundle, "tp2dp2": tp2_dp2_bundle, **made}


def _compare(runs: dict[str, Path], *names: str) -> Comparison:
    return compare_bundles([str(runs[n]) for n in names])


def _drawn(fig) -> list[tuple[str, list[float], bool]]:
    """The throughput panel's lines: (legend name, x values, joined by a line)."""
    return [(line.get_label(), [float(x) for x in line.get_xdata()],
             line.get_linestyle() not in ("None", "none", ""))
            for line in fig.axes[0].get_lines()]


def _alike_but_the_parameter(c: Comparison) -> None:
    """Every line of the comparison's sweep joins runs of one world size (DP's: of one world
    size per DP), one execution mode, precision, engine and batch, the other degrees equal."""
    sweep = find_sweep(c)
    for line in sweep.lines:
        groups = [g for _, g in line.points]
        if sweep.parameter == "dp":
            worlds = {world_size(g) // g.first.config["parallel"]["dp"] for g in groups}
        else:
            worlds = {world_size(g) for g in groups}
        assert len(worlds) == 1, (line.name, worlds)
        assert len({execution_mode(g.bundles[0]) for g in groups}) == 1
        moves = {sweep.parameter} | ({"dp"} if sweep.parameter in ("tp", "pp", "cp") else set())
        held = {json.dumps([g.first.config["dtype"], g.first.config["engine"],
                            g.first.config["global_batch_size"],
                            g.first.config["micro_batch_size"]
                            if sweep.parameter != "micro_batch_size" else None,
                            {k: v for k, v in g.first.config["parallel"].items()
                             if k not in moves}]) for g in groups}
        assert len(held) == 1, (line.name, held)


def test_a_tp_line_holds_the_world_size_and_a_lone_run_is_a_point(runs):
    c = _compare(runs, "tp1", "dp2", "tp2")
    _alike_but_the_parameter(c)
    fig = sweep_lines(c)
    assert fig.get_suptitle().startswith(
        "Against TP degree at a fixed world size (DP moves with it): a line joins")
    # TP1 x DP2 and TP2 x DP1 on 2 ranks are a line; TP1 on 1 rank matches neither: a point
    assert _drawn(fig) == [("2 ranks", [1.0, 2.0], True), ("1 rank", [1.0], False)]
    [line, point] = fig.axes[0].get_lines()
    tokens = {n: json.loads((runs[n] / "metrics.json").read_text())["summary"]["tokens_per_s"]
              for n in ("tp1", "dp2", "tp2")}
    assert list(line.get_ydata()) == pytest.approx([tokens["dp2"], tokens["tp2"]])
    assert list(point.get_ydata()) == pytest.approx([tokens["tp1"]])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["2 ranks", "1 rank"]
    assert "all held alike: gpt3-tiny cpu fp32 eager megatron pp1 mb2 gb8" in " ".join(
        fig.get_suptitle().split("\n"))
    assert all(ax.get_ylim()[0] == 0 for ax in fig.axes if ax.get_visible())


def test_runs_of_different_world_sizes_are_never_one_tp_line(runs):
    # issue 58: TP1 x DP1 (1 rank) and TP2 x DP2 (4 ranks) were one line "pp1 mb2 gb8"
    assert find_sweep(_compare(runs, "tp1", "tp2dp2")) is None
    assert sweep_lines(_compare(runs, "tp1", "tp2dp2")) is None
    # with TP2 x DP1 beside them, DP is what varies alone: TP2 from 2 to 4 ranks is a line
    # (the world size grows with DP, the title says), TP1 a point
    c = _compare(runs, "tp1", "tp2", "tp2dp2")
    _alike_but_the_parameter(c)
    fig = sweep_lines(c)
    assert fig.get_suptitle().startswith("Against DP degree (the world size grows with it)")
    assert _drawn(fig) == [("tp2", [1.0, 2.0], True), ("tp1", [1.0], False)]
    c = _compare(runs, "tp1", "dp2", "tp2", "tp2dp2")
    _alike_but_the_parameter(c)
    assert [(e.name, len(e.points)) for e in find_sweep(c).entries] == [("tp1", 2), ("tp2", 2)]


def _graphed_copy(source: Path, out: Path, old_notes: bool) -> Path:
    """``source`` as if its step had been replayed from a CUDA graph: its ``execution`` says
    so, or (a bundle written before the field) its speed-features note lists cuda_graph."""
    dest = shutil.copytree(source, out / f"{source.name}-graphed")
    metrics = json.loads((dest / "metrics.json").read_text())
    if old_notes:
        metrics["execution"] = {}
        metrics["notes"] = [n for n in metrics["notes"] if not n.startswith("speed features:")]
        metrics["notes"].append("speed features: cuda_graph, fusions")
    else:
        metrics["execution"] = {"mode": "graphed", "eager_because": []}
    (dest / "metrics.json").write_text(json.dumps(metrics))
    write_sums(dest)
    return dest


@pytest.mark.parametrize("old_notes", [False, True], ids=["execution", "notes"])
def test_a_graphed_run_is_not_on_the_eager_runs_line(runs, tmp_path, old_notes):
    graphed = _graphed_copy(runs["mb1"], tmp_path, old_notes)
    c = compare_bundles([str(graphed), str(runs["tp1"]), str(runs["mb4"])])
    _alike_but_the_parameter(c)
    fig = sweep_lines(c)
    assert fig.get_suptitle().startswith("Against micro-batch size: a line joins")
    assert _drawn(fig) == [("eager", [2.0, 4.0], True), ("graphed", [1.0], False)]
    eager = compare_bundles([str(runs["mb1"]), str(runs["tp1"]), str(runs["mb4"])])
    assert _drawn(sweep_lines(eager)) == [
        ("gpt3-tiny cpu 1 rank fp32 eager megatron tp1 pp1 dp1 gb8", [1.0, 2.0, 4.0], True)]


def test_compare_keeps_graphed_and_eager_runs_of_one_layout_apart(runs, tmp_path, cli):
    """Two graphed copies of the 1-rank run (one says so in ``execution``, one only in its
    notes, as bundles before the field did) beside the eager run itself: once one group whose
    median mixed both executions; now a graphed group of two and an eager group of one."""
    eager = runs["tp1"]
    graphed = [_graphed_copy(eager, tmp_path / "field", old_notes=False),
               _graphed_copy(eager, tmp_path / "notes", old_notes=True)]
    bundles = [str(b) for b in (eager, *graphed)]
    c = compare_bundles(bundles)
    assert [(g.label.rsplit(" ", 1)[-1], len(g.bundles)) for g in c.groups] == [
        ("eager", 1), ("graphed", 2)]
    [check] = [ch for ch in c.checks if ch.kind == "execution"]
    assert "graphed (2: " in check.message and "eager (1: " in check.message
    swept = compare_bundles(bundles, swept={"eager"})  # a sweep that varies it on purpose
    assert len(swept.groups) == 2 and not [ch for ch in swept.checks if ch.kind == "execution"]
    table = cli("compare", *bundles)
    assert table.returncode == 0, table.stderr
    assert "[execution] different execution modes" in table.stdout
    # runs of one mode keep their names as they were
    assert not compare_bundles([str(eager), str(runs["mb1"])]).groups[0].label.endswith("eager")


def test_a_finding_figure_stands_only_under_evidence_and_from_zero(runs):
    # issue 58: the CPU micro-batch sweep has no power: "not measurable here", and no figure
    result = microbatch_bursts([read_facts(runs[n]) for n in ("mb1", "tp1", "mb4")])
    assert result.verdict == "not measurable here"
    assert result.plot is None or finding_figure(result.plot, result.finding.title,
                                                 result.verdict) is None
    # the recorded Mixtral pair's recompute verdict: bars of change from a zero line
    recorded = sorted(REPO.glob("tests/data/bundles/parallel/2*"))
    [recompute] = [r for r in all_findings([read_facts(p) for p in recorded])
                   if r.finding.id == "recompute-power"]
    assert recompute.plot is not None
    for no_evidence in ("not measurable here", "confounded"):
        assert finding_figure(recompute.plot, recompute.finding.title, no_evidence) is None
    ax = finding_figure(recompute.plot, recompute.finding.title, "agrees").axes[0]
    low, high = ax.get_ylim()
    assert low < 0 < high  # mean power fell: the axis holds zero and the fall
    assert ax.get_title() == f"{recompute.finding.title}\nthis node: agrees"


def test_a_finding_figure_gives_sample_counts_and_another_origin_when_the_plot_has_them():
    plot = Plot("line", "micro-batch size", "worst-GPU peak-to-mean power",
                {"global batch 16": [(1, 1.27), (8, 1.9)], "global batch 2": [(1, 1.3)],
                 "no values": []},
                samples={"global batch 16": [12, 14], "global batch 2": [9]}, y_origin=1.0)
    ax = finding_figure(plot, "bursts", "agrees").axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "global batch 16 (n=12-14)", "global batch 2 (n=9)"]
    assert ax.get_ylim()[0] == 1.0
    assert ax.get_ylabel() == "worst-GPU peak-to-mean power (axis from 1)"


@pytest.fixture(scope="module")
def batch_sweep(tmp_path_factory) -> Path:
    """A sweep folder of two points: micro-batch 1 at global batch 4, 2 at 8."""
    out = tmp_path_factory.mktemp("batch-sweep")
    (out / "batches.yaml").write_text(SWEEP)
    r = kit_cli("sweep", str(out / "batches.yaml"), "--out", str(out / "results"))
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "results" / "batches"


SWEPT_NOTE = ("[swept] the swept axes, varied on purpose (so not flagged as differences): "
              "micro_batch_size 1, 2; global_batch_size 4, 8")


def test_a_sweeps_axes_are_said_as_swept_not_flagged(batch_sweep, tmp_path):
    r = kit_cli("compare", str(batch_sweep))
    assert r.returncode == 0, r.stderr
    checks = r.stdout.split("comparability:\n")[1].split("\n\n")[0]
    assert SWEPT_NOTE in checks and "[batch]" not in checks
    # the same bundles given one by one came from nowhere in particular: the warning stands
    bundles = sorted(str(p) for p in batch_sweep.glob("*/2*"))
    r = kit_cli("compare", *bundles)
    checks = r.stdout.split("comparability:\n")[1].split("\n\n")[0]
    assert "[batch] different micro-batch" in checks and "[batch] different global batch" in checks
    assert "[swept]" not in checks
    r = kit_cli("report", str(batch_sweep), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, why_failed(r)
    section = (tmp_path / "r.html").read_text().split('<h2 id="comparability">')[1]
    lines = [html.unescape(x) for x in re.findall(r"<li>(.*?)</li>", section.split("</ul>")[0])]
    assert SWEPT_NOTE in lines and not any(x.startswith("[batch]") for x in lines)


def test_the_study_report_says_its_factors_are_swept(batch_sweep, tmp_path):
    folder = shutil.copytree(batch_sweep, tmp_path / "study")  # a study folder is its sweep's
    bundles = sorted(folder.glob("*/2*"))
    _, _, report = conclude(folder, bundles, "cpux1", say=lambda line: None)
    section = report.read_text().split('<h2 id="comparability">')[1].split("</ul>")[0]
    lines = [html.unescape(x) for x in re.findall(r"<li>(.*?)</li>", section)]
    assert SWEPT_NOTE in lines and not any(x.startswith("[batch]") for x in lines)
