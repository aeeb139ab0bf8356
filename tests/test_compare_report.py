"""`compare` and `report` through the CLI on real CPU runs and the recorded H100/H200 bundles."""

import base64
import csv
import io
import json
import os
import re
import shutil
import statistics
from pathlib import Path

import pytest

from .conftest import REPO, kit_cli, why_failed

GPU = sorted((REPO / "tests/data/bundles/telemetry").iterdir())
H100, H200 = (next(b for b in GPU if b.name.endswith(tag)) for tag in ("h100-f4a12c",
                                                                        "h200-bceb8a"))

ODD_ROPE = (  # megatron-core rejects it at build time (RoPE needs an even head dim): a failed run
    "family: llama3\nnum_layers: 2\nhidden_size: 66\nnum_attention_heads: 2\n"
    "ffn_hidden_size: 128\nseq_length: 16\nvocab_size: 256\nactivation: swiglu\n"
    "normalization: rmsnorm\nposition_embedding: rope\nadd_bias_linear: false\n"
    "tie_embeddings: false\nglobal_batch_size: 2\n"
)


REPLAY_EXTRA = (  # a 2 x 2 chassis for the heatmap, and a rule that scales gpt3-tiny down
    "chassis:\n" + "".join(f"  - {{device: {d}, slot: S{d}, row: {d // 2}, col: {d % 2}}}\n"
                           for d in range(4))
    + "scaling:\n  gpt3-tiny:\n    reason: keep the test short\n    set: {num_layers: 1}\n"
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, gpt3_tiny_reference) -> dict[str, Path]:
    """Two repeats of gpt3-tiny TP1 (cpu, no power), one TP2 of gpt3-tiny scaled to one layer
    by a platform rule with the recorded H100 trace replayed as its GPU telemetry, and one
    failed run. One after another: side by side they
    fight over the two cores and take longer. The second repeat is the session's one-process
    reference run (4 measured steps, not 3: the step count is no part of what makes runs
    repeats), which other modules build anyway; compare only reads it."""
    out = tmp_path_factory.mktemp("runs")
    (out / "odd-rope.yaml").write_text(ODD_ROPE)
    replay = out / "cpu-replay-chassis.yaml"
    replay.write_text((REPO / "tests/data/platforms/cpu-replay-h100.yaml").read_text()
                      + REPLAY_EXTRA)
    short = ["--steps", "3", "--warmup", "1"]
    argv = {"tp1a": ["gpt3-tiny", *short, "--out", str(out / "a")],
            "tp2": ["gpt3-tiny", "--tp", "2", "--platform", str(replay), *short, "--profile",
                    "--out", str(out / "c")],
            "failed": [str(out / "odd-rope.yaml"), "--steps", "2", "--warmup", "0",
                       "--out", str(out / "d")]}
    bundles = {}
    for k, a in argv.items():
        r = kit_cli("run", *a)
        assert r.returncode == (1 if k == "failed" else 0), r.stderr
        bundles[k] = Path(r.stdout.strip().splitlines()[-1])
    return {"tp1a": bundles["tp1a"], "tp1b": gpt3_tiny_reference,
            "tp2": bundles["tp2"], "failed": bundles["failed"]}


def summary(bundle: Path) -> dict:
    return json.loads((bundle / "metrics.json").read_text())["summary"]


def compare_json(cli, *args: str) -> dict:
    r = cli("compare", *args, "--format", "json")
    assert r.returncode == 0, why_failed(r)
    return json.loads(r.stdout)


def group_of(result: dict, bundle: Path) -> dict:
    return next(g for g in result["groups"] if str(bundle) in g["bundles"])


def test_table_flags_platforms_workloads_and_the_failed_run(cli, runs):
    r = cli("compare", str(H100), str(H200), *(str(b) for b in runs.values()))
    assert r.returncode == 0, why_failed(r)
    out = r.stdout
    assert "6 bundles in 5 groups" in out and "FAILED (1 run)" in out
    checks = out.split("comparability:")[1]
    assert re.search(r"\[platform\] different platforms.*h100.*h200.*cpu.*cpu-replay-chassis",
                     checks)
    assert re.search(r"\[telemetry\] different power sources: nvml power_w .*; replay power_w",
                     checks)
    assert re.search(r"\[workload\] different workload architectures.*gpt3-1\.3b: .*"
                     r"hidden_size=2048.*gpt3-tiny: .*odd-rope: ", checks)
    assert (f"[scaled] gpt3-tiny@cpu-replay-chassis is a scaled variant of gpt3-tiny by the "
            f"cpu-replay-chassis platform rule (num_layers 4->1: keep the test short); "
            f"bundles: {runs['tp2'].name}") in checks
    assert "[precision] different precision: bf16" in checks
    assert "[sequence] different sequence length: 2048" in checks
    assert f"[status] {runs['failed'].name} (odd-rope) ended failed: rank 0: " in checks
    # five groups do not fit 120 columns: the table is split, each part under 120 characters
    tables = out.split("all metrics:\n")[1].split("\n\n")
    grids = [t for t in tables if t.startswith("metric ")]
    assert len(grids) >= 2 and all(len(line) <= 120 for t in grids for line in t.splitlines())
    # plain CPU runs measured no power: n/a, never 0; the replayed trace gives a value
    power = [line.split()[3:] for t in grids for line in t.splitlines()
             if line.startswith("mean power (W)")]
    cells = [cell for part in power for cell in part]
    assert cells[:2] == ["698.6", "681.5"] and cells[2] == cells[4] == "n/a"
    assert float(cells[3]) == pytest.approx(summary(runs["tp2"])["power_w_mean"], rel=1e-3)
    assert "step time (s)" in out  # every row with a unit says it


def test_same_workload_on_two_gpus_only_differs_in_platform(cli):
    r = cli("compare", str(H100), str(H200))
    checks = r.stdout.split("comparability:")[1].strip().splitlines()
    assert r.returncode == 0 and len(checks) == 1 and checks[0].lstrip().startswith("[platform]")


def test_baseline_ratios_are_those_of_metrics_json(cli, runs):
    result = compare_json(cli, str(H200), str(H100), str(runs["tp1a"]), str(runs["tp2"]),
                          str(runs["failed"]), "--baseline", H100.name)
    h100, h200 = summary(H100), summary(H200)
    base = group_of(result, H100)
    assert result["baseline"] == base["label"]
    assert base["metrics"]["tokens_per_s"]["ratio_to_baseline"] == 1
    other = group_of(result, H200)["metrics"]
    for key in ("tokens_per_s", "energy_j_per_token", "power_w_peak", "mem_peak_gib"):
        ratio = h200[key] / h100[key]
        assert other[key]["median"] == h200[key]
        assert other[key]["ratio_to_baseline"] == pytest.approx(ratio, rel=1e-12)
        assert other[key]["pct_diff_to_baseline"] == pytest.approx((ratio - 1) * 100, rel=1e-9)
    # fractions and temperatures: a difference (percentage points, degrees), never a ratio
    for key in ("mfu", "temp_gpu_c_max", "throttle_frac", "clock_sm_frac_of_max"):
        if h200[key] is None:
            assert other[key]["diff_to_baseline"] is None
            continue
        assert other[key]["ratio_to_baseline"] is None
        assert other[key]["diff_to_baseline"] == pytest.approx(h200[key] - h100[key])
    cpu = group_of(result, runs["tp1a"])["metrics"]
    assert cpu["power_w_mean"] == {"median": None, "min": None, "max": None, "n": 0,
                                   "ratio_to_baseline": None, "pct_diff_to_baseline": None,
                                   "diff_to_baseline": None}
    assert cpu["mfu"]["median"] is None  # the cpu profile declares no peak
    replayed = group_of(result, runs["tp2"])["metrics"]
    power = json.loads((runs["tp2"] / "metrics.json").read_text())["power"]
    assert replayed["power.peak_to_mean"]["median"] == power["peak_to_mean"]
    assert replayed["throttle_frac_by_reason.power_cap"]["median"] == (
        power["throttle_frac_by_reason"]["power_cap"])
    h100_power = json.loads((H100 / "metrics.json").read_text())["power"]
    assert replayed["power.peak_to_mean"]["diff_to_baseline"] == pytest.approx(
        power["peak_to_mean"] - h100_power["peak_to_mean"])
    assert replayed["power_w_mean"]["ratio_to_baseline"] == pytest.approx(
        summary(runs["tp2"])["power_w_mean"] / summary(H100)["power_w_mean"])
    failed = group_of(result, runs["failed"])
    assert failed["status"] == "failed" and failed["metrics"]["tokens_per_s"]["n"] == 0
    assert any(c["kind"] == "status" for c in result["checks"])


def test_table_relates_by_ratio_or_difference_and_drops_quiet_throttle_rows(cli):
    r = cli("compare", str(H100), str(H200), "--baseline", str(H100))
    assert r.returncode == 0, why_failed(r)
    grid = r.stdout.split("all metrics:\n")[1].split("\n\n")[0]
    rows = {cells[0]: cells[1:] for line in grid.splitlines()
            if len(cells := re.split(r" {2,}", line.strip())) == 4}
    h100, h200 = summary(H100), summary(H200)
    temp = h200["temp_gpu_c_max"] - h100["temp_gpu_c_max"]
    assert rows["max temperature (°C)"][2] == f"{temp:+.1f} °C"
    ratio = h200["tokens_per_s"] / h100["tokens_per_s"]
    assert rows["throughput (tokens/s)"][2] == f"x{ratio:.3f} ({(ratio - 1) * 100:+.1f}%)"
    assert rows["peak memory (GiB)"][2].startswith("x")
    # throttle reasons never active in either run: left out and named once
    assert "throttled, power_cap" in rows and "throttled, thermal_hw" not in rows
    assert ("throttle reasons 0 or not measured in every configuration (rows left out): "
            "thermal_sw, thermal_hw, hw_slowdown, power_brake, other") in r.stdout
    # what both share is said once, not in every header
    assert "all configurations: gpt3-1.3b bf16 megatron tp1 pp1 dp1 mb4 gb16" in r.stdout
    header = grid.split("----")[0]
    assert "gpt3-1.3b" not in header and "h100 x1" in header and "h200 x1" in header


def test_repeats_aggregate_to_median_min_max(cli, runs):
    result = compare_json(cli, str(runs["tp1a"]), str(runs["tp1b"]), str(runs["tp2"]),
                          "--baseline", str(runs["tp2"]))
    tp1 = group_of(result, runs["tp1a"])
    assert set(tp1["bundles"]) == {str(runs["tp1a"]), str(runs["tp1b"])}
    values = [summary(runs[k])["tokens_per_s"] for k in ("tp1a", "tp1b")]
    got = tp1["metrics"]["tokens_per_s"]
    assert (got["median"], got["min"], got["max"], got["n"]) == pytest.approx(
        (statistics.median(values), min(values), max(values), 2))
    assert got["ratio_to_baseline"] == pytest.approx(
        statistics.median(values) / summary(runs["tp2"])["tokens_per_s"])
    # same batch, precision; all ok; the replay platform and its scaled variant differ, so the
    # baseline's ratios span two workloads and say so
    assert [c["kind"] for c in result["checks"]] == ["workload", "scaled", "platform",
                                                     "baseline"]
    assert "num_layers=4" in result["checks"][0]["message"]
    assert "compare different workloads" in result["checks"][-1]["message"]


def test_every_format_parses(cli, runs):
    args = [str(H100), str(runs["tp1a"]), str(runs["failed"]), "--baseline", str(H100)]
    r = cli("compare", *args, "--format", "csv")
    assert r.returncode == 0, why_failed(r)
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    metrics = {row["metric"] for row in rows}
    assert len(rows) == 3 * len(metrics) and {"tokens_per_s", "mfu", "power.peak_to_mean",
                                              "throttle_frac_by_reason.power_cap"} <= metrics
    h100 = next(row for row in rows if row["metric"] == "tokens_per_s" and "h100" in row["group"])
    assert float(h100["median"]) == summary(H100)["tokens_per_s"]
    assert float(h100["ratio_to_baseline"]) == 1.0
    cpu = next(row for row in rows
               if row["metric"] == "power_w_mean" and "gpt3-tiny" in row["group"])
    assert cpu["median"] == "n/a" and cpu["n"] == "0"
    assert "comparability: [status]" in r.stderr  # checks go to stderr, stdout stays one table
    r = cli("compare", *args, "--format", "markdown")
    assert r.returncode == 0 and re.search(r"^\| throughput \(tokens/s\) +\| +58,797 \|",
                                           r.stdout, re.M)
    assert "**comparability**" in r.stdout and "vs baseline" in r.stdout
    assert len(compare_json(cli, *args)["groups"]) == 3


def test_many_repeats_compare_as_one_group(cli, tmp_path):
    """Whole bundles: compare verifies each one (every file hashed) before reading it; 40
    repeats make one group that names three and counts the rest. How fast 200 go is
    benchmarks/perf/compare_200.py's to say (a test asserts behaviour, not speed)."""
    paths = [str(shutil.copytree(H200, tmp_path / f"copy{i:03d}", copy_function=os.link))
             for i in range(40)]
    r = cli("compare", *paths)
    assert r.returncode == 0, why_failed(r)
    assert "40 bundles in 1 group" in r.stdout and "and 37 more" in r.stdout


@pytest.fixture(scope="module")
def profiled(runs) -> Path:
    """The TP2 (replay) run, made with ``--profile``: a trace and a breakdown per rank."""
    assert sorted(p.name for p in (runs["tp2"] / "profile").iterdir()) == [
        "rank0.breakdown.json", "rank0.json", "rank1.breakdown.json", "rank1.json"]
    return runs["tp2"]


def figure_ids(text: str) -> set[str]:
    return set(re.findall(r'<figure id="([^"]+)"', text))


PER_RUN = {"power-timeline": "power-timelines", "chassis-heatmap": "chassis-heatmaps",
           "clock-throttle": "clock-throttle-timelines"}
"""A run's anchor for each figure of several runs, and that figure's id (without ``-k``)."""


def run_panels(text: str) -> dict[str, str]:
    """Each run's pointer at its rows of the figures of several runs, by anchor."""
    return dict(re.findall(r'<p class="panel" id="([^"]+)">(.*?)</p>', text))


def test_html_report_is_self_contained_and_has_every_figure(cli, runs, profiled, tmp_path):
    out = tmp_path / "r" / "report.html"
    r = cli("report", str(H100), str(H200), str(runs["tp1a"]), str(runs["failed"]),
            str(profiled), "-o", str(out), "--single-file")
    assert r.returncode == 0, why_failed(r)
    assert r.stdout.strip() == str(out.resolve())
    text = out.read_text()
    sources = re.findall(r'src="([^"]*)"', text)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r'(href|src)="(https?:)?//', text) and "<link" not in text
    for s in sources:
        assert base64.b64decode(s.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    across = {"config-bars", "efficiency", "per-gpu", "gpu-heatmap", "profile-breakdowns",
              "exposed-comm", "link-traffic", "position-timelines", "throttle-timelines"}
    shared = {f"{f}-1" for f in PER_RUN.values()}  # 5 runs: one figure of each kind
    assert figure_ids(text) == across | shared | {
        f"kernel-breakdown-{n}" for n in range(1, 6)}
    figures = dict(re.findall(r'<figure id="([^"]+)">(.*?)</figure>', text, re.S))
    with_image = {k for k, v in figures.items() if "<img" in v}
    assert with_image == across | {"kernel-breakdown-5"} | shared
    # every run points at its rows, or says why it has none; each figure lists its runs
    panels = run_panels(text)
    assert set(panels) == {f"{p}-{n}" for p in PER_RUN for n in range(1, 6)}
    drawn = {1: H100, 2: H200, 5: profiled}
    for anchor, figure in PER_RUN.items():
        for row, (n, bundle) in enumerate(drawn.items(), 1):
            assert f'<a href="#{figure}-1">row {row} of 3 in ' in panels[f"{anchor}-{n}"]
            assert re.search(rf"Rows: (\d[^;]*; )*{n}\. [^;]*\({bundle.name}\)",
                             figures[f"{figure}-1"])
        assert "href" not in panels[f"{anchor}-3"] + panels[f"{anchor}-4"]
    # platforms and workloads differ: no sweep to draw, said in the one line of left-outs
    left_out = re.search(r'<p class="sub" id="not-drawn">([^<]*)</p>', text).group(1)
    assert left_out.startswith("Nothing to draw, so left out: Against the swept parameter: ")
    assert "no two configurations differ in one parameter only" in left_out
    # a CPU run without RAPL: the recorded reason, not a guess
    assert re.search(r"no samples of power_w: [^;]+; temp_gpu_c: [^;]+; cpu_power_w: host: ",
                     panels["power-timeline-3"])
    assert "no profile in this bundle" in figures["kernel-breakdown-1"]
    assert "Kernel time by category" in figures["kernel-breakdown-5"]
    assert "SM clock and active throttle reasons" in figures["clock-throttle-timelines-1"]
    assert "by node and chassis position" in figures["chassis-heatmaps-1"]
    assert "platform cpu declares no chassis layout" in panels["chassis-heatmap-3"]
    assert "ended failed" in text and "<table>" in text
    # a table of contents linking every part; sections named by configuration
    links = set(re.findall(r'<a href="#([^"]+)">', text.split("</nav>")[0]))
    assert links == {"comparison", "comparability", "across", "runs", "runs-1"} | (
        across | {f"bundle-{n}" for n in range(1, 6)})
    titles = re.findall(r'<h3 id="bundle-\d">\d\. ([^<]+)</h3>', text)
    # megatron pp1 dp1: shared; the H100 run's step was graphed, so each names its mode
    assert titles[2] == "gpt3-tiny cpu x1 fp32 tp1 mb2 gb8 eager"
    assert titles[3].endswith("[failed]")


def test_markdown_report_links_every_figure(cli, runs, tmp_path):
    out = tmp_path / "report.md"
    r = cli("report", str(H100), str(runs["failed"]), "-o", str(out), "--markdown")
    assert r.returncode == 0, why_failed(r)
    text = out.read_text()
    links = re.findall(r"!\[[^\]]*\]\((report_figures/[^)]+\.png)\)", text)
    assert sorted(Path(link).stem for link in links) == sorted(
        ["config-bars", "efficiency", "per-gpu", "gpu-heatmap", "link-traffic",
         "position-timelines", "throttle-timelines", "power-timelines-1", "chassis-heatmaps-1",
         "clock-throttle-timelines-1"])
    for anchor, figure in PER_RUN.items():  # the H100 run's rows; the failed run has none
        assert re.search(rf'<a id="{anchor}-1"></a>\*[^*]+\*: \[row 1 of 1 in the figure '
                         rf"[^\]]+\]\(#{figure}-1\)", text)
        assert re.search(rf'<a id="{anchor}-2"></a>\*[^*]+\*: [^\[]+\.\n', text)
    assert all((tmp_path / link).read_bytes()[:4] == b"\x89PNG" for link in links)
    assert '<a id="kernel-breakdown-1"></a>' in text and "no profile in this bundle" in text
    assert "## Comparability" in text and "ended failed" in text
    assert "## Contents" in text and "- [Runs](#runs)" in text


def test_a_baseline_that_did_not_end_ok_is_refused(cli, runs, tmp_path):
    for command in (["compare"], ["report", "-o", str(tmp_path / "r.html")]):
        r = cli(*command, str(H100), str(runs["failed"]), "--baseline", str(runs["failed"]))
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
        assert r.stderr.startswith(f"error: baseline {runs['failed'].name} ended failed: ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, needle", [
    (["compare", "tests"], "tests is neither a bundle nor a folder of bundles"),
    (["compare", str(H100), "--baseline", "nonesuch"], "unknown baseline nonesuch"),
    (["compare", str(H100), str(H100)], "is given twice"),
    (["report", "no/such/dir", "-o", "x.html"], "no bundle at no/such/dir"),
])
def test_bad_input_exits_2_with_one_line(cli, args, needle):
    r = cli(*args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and needle in r.stderr


@pytest.mark.timeout(120)
def test_a_long_error_is_shortened_at_a_word_boundary(cli, tmp_path):
    from .test_bundle_archive import rehash

    bundle = shutil.copytree(H100, tmp_path / H100.name)
    words = [f"word{i:02d}" for i in range(40)]
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest.update(status="failed", error="rank 1: " + " ".join(words) + "\nsecond line")
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    rehash(bundle)
    check = next(c for c in compare_json(cli, str(bundle))["checks"] if c["kind"] == "status")
    quoted = check["message"].split("ended failed: ", 1)[1].split("; its figures", 1)[0]
    assert quoted.endswith("...") and len(quoted) <= 160
    assert quoted[:-3].split()[2:] == words[:len(quoted[:-3].split()) - 2]  # whole words only


def test_shorten_cuts_between_words_or_inside_one_long_token():
    from kit.metrics.text import shorten

    assert shorten("short enough", 12) == "short enough"
    assert shorten("connection reset by peer", 20) == "connection reset..."
    assert shorten("see /a/very/long/path/to/the/rank/log", 20) == "see /a/very/long/..."


def test_kernel_breakdown_counts_operator_self_time_once(profiled):
    from kit.bundle.reader import read_bundle
    from kit.metrics.kernels import kernel_times

    times = kernel_times(read_bundle(profiled))["rank0.json"]
    assert times["MatMul"] > 0 and times["norm"] > 0
    events = json.loads((profiled / "profile" / "rank0.json").read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]

    def inside(i, j):  # op i nested in op j on the same thread (identical spans: j first)
        a, b = ops[i], ops[j]
        same = (a["ts"], a["dur"]) == (b["ts"], b["dur"])
        return (i != j and (a["pid"], a["tid"]) == (b["pid"], b["tid"]) and (j < i or not same)
                and b["ts"] <= a["ts"] and a["ts"] + a["dur"] <= b["ts"] + b["dur"])

    top = [ops[i] for i in range(len(ops)) if not any(inside(i, j) for j in range(len(ops)))]
    # self times partition the top-level operators' time: nothing counted twice or dropped
    assert sum(times.values()) == pytest.approx(sum(e["dur"] for e in top) / 1e6, rel=1e-9)


SWEEP = """name: mini
base: {workload: gpt3-tiny, platform: cpu, steps: 2, warmup: 1, telemetry_interval_ms: 0}
axes:
  - product: {tp: [1, 3]}
"""


@pytest.mark.training
@pytest.mark.timeout(600)
def test_a_sweep_folder_stands_for_its_bundles(cli, tmp_path):
    """`compare results/*` after a sweep: bundles of single runs beside a sweep folder."""
    results = tmp_path / "results"
    (tmp_path / "mini.yaml").write_text(SWEEP)
    r = cli("sweep", str(tmp_path / "mini.yaml"), "--out", str(results))
    assert r.returncode == 0, r.stderr
    shutil.copytree(H100, results / H100.name)
    index = json.loads((results / "mini" / "sweep.json").read_text())
    point = results / "mini" / index["points"][0]["bundle"]
    paths = sorted(str(p) for p in results.iterdir())
    result = compare_json(cli, *paths)
    assert sorted(b for g in result["groups"] for b in g["bundles"]) == sorted(
        [str(point), str(results / H100.name)])
    [note] = [c["message"] for c in result["checks"] if c["kind"] == "sweep"]
    assert note == (f"sweep folder {results / 'mini'}: 1 bundle used; no bundle for 002-tp3 "
                    "(skipped)")
    r = cli("report", *paths, "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, why_failed(r)
    r = cli("bundle", "show", str(results / "mini"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{results / 'mini'} is a sweep folder (sweep mini: 2 points, "
                               "1 with a bundle), not a bundle")
    assert str(point) in r.stdout and "002-tp3  skipped" in r.stdout


MIXTRAL = sorted((REPO / "tests/data/bundles/parallel").iterdir())[0]


def test_the_ranking_counts_a_copied_bundle_once_and_flags_the_energy_check(cli, tmp_path):
    copy = shutil.copytree(H100, tmp_path / "elsewhere" / H100.name)
    r = cli("compare", str(H200), str(H100), str(copy))
    assert r.returncode == 0, why_failed(r)
    assert "2 bundles in 2 groups" in r.stdout
    assert f"[duplicate] {H100.name} is given 2 times" in r.stdout
    ranking = r.stdout.split("ranking:\n")[1].split("\n\n")[0].splitlines()
    rows = [line.rstrip() for line in ranking if re.match(r"\d +", line)]
    # ranked by throughput: the H100 run first, its worst energy disagreement flagged
    assert [row.split()[0] for row in rows] == ["1", "2"] and " h100 " in rows[0]
    power = json.loads((H100 / "metrics.json").read_text())["power"]
    worst = max(abs(power[k]) for k in ("zeus_vs_counter", "counter_vs_integral") if k in power)
    assert worst > 0.02 and rows[0].endswith(f"{worst * 100:.1f}% !")
    assert "disagree by more than 2%" in r.stdout
    assert "Peak power is instantaneous" in r.stdout


def test_a_baseline_across_workloads_gets_a_caveat(cli):
    r = cli("compare", str(H100), str(MIXTRAL), "--baseline", str(H100))
    assert r.returncode == 0, why_failed(r)
    assert ("[baseline] the baseline is gpt3-1.3b; ratios to it for mixtral-8x7b-4l compare "
            "different workloads") in r.stdout
    ranking = r.stdout.split("ranking:\n")[1].split("\n\n")[0]
    # each workload is ranked on its own: both runs are first of theirs
    assert [line.split()[1] for line in ranking.splitlines()[4:]] == ["1", "1"]
