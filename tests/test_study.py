"""``charllm-kit study``: the findings over recorded bundles, the node-sized matrix, a CPU study.

The verdict tests read real bundles recorded on H100/H200s (tests/data/bundles and its
telemetry/ and parallel/). Where a verdict needs runs no recorded bundle has (a micro-batch sweep,
four GPUs' temperatures), the cases are a recorded H200 bundle's manifest.json and metrics.json
with the settings and figures named in each case changed: the numbers of issue 38's 4-H200 runs.
"""
# ruff: noqa: D103  (test names say what they check)

import copy
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kit.bundle.budget import BUDGET_ENV
from kit.bundle.telemetry_fields import TELEMETRY_SCHEMA
from kit.engines.execution import Execution
from kit.study.catalog import FINDING_IDS
from kit.study.facts import read_facts
from kit.study.verdicts import (
    all_findings,
    microbatch_bursts,
    pp_throttle,
    thermal_position,
    tp_pp_links,
)

from .conftest import bundle_path, why_failed
from .hostile_bundles import constant_rows, copy_bundle, kit, one_error

REPO = Path(__file__).resolve().parent.parent
RECORDED = sorted([*REPO.glob("tests/data/bundles/2*"), *REPO.glob("tests/data/bundles/*/2*")])
PARALLEL = REPO / "tests/data/bundles/parallel"
H200 = PARALLEL / "20261124T201036Z-mixtral-8x7b-4l-h200-4a76f4"
RECORDED_ON = "20261124T201141Z-mixtral-8x7b-4l-h200-588d9e"
"""The recorded Mixtral run with full recomputation (the pair of :data:`H200`)."""


def _verdicts(paths: list[Path]) -> dict[str, str]:
    return {r.finding.id: r.verdict for r in all_findings([read_facts(p) for p in paths])}


def test_recorded_bundles_give_a_verdict_per_finding():
    results = {r.finding.id: r for r in all_findings([read_facts(p) for p in RECORDED])}
    assert list(results) == list(FINDING_IDS)
    verdicts = {k: r.verdict for k, r in results.items()}
    # One-GPU runs of two platforms: nothing multi-GPU or multi-node can be judged ...
    for fid in ("scale-up", "tp-pp-links", "microbatch-bursts", "thermal-position",
                "pp-throttle", "thermal-placement", "overlap-power"):
        assert verdicts[fid] == "not measurable here", (fid, results[fid].why)
    assert "h100" in results["scale-up"].why and "h200" in results["scale-up"].why
    # ... but the two Mixtral 8x7B runs on one H200 differ only in full recomputation: it slowed
    # the step by a quarter and left mean power within 3% (-2.5%) and the hottest GPU alike.
    rec = results["recompute-power"]
    assert rec.verdict == "disagrees", rec.why
    pair = rec.evidence["pairs"][0]
    assert pair["step_time_change"] == pytest.approx(0.26, abs=0.02)
    assert pair["power_w_mean_change"] == pytest.approx(-0.025, abs=0.005)
    assert sorted(rec.bundles) == sorted(p.name for p in RECORDED if "mixtral" in p.name)
    entry = rec.as_json()
    assert set(entry) >= {"finding", "verdict", "evidence", "bundles"}
    json.dumps(entry)


def _derive(tmp: Path, name: str, *, parallel: dict[str, Any], mb: int, gbs: int,
            recompute: str = "full", devices: list[dict[str, Any]] | None = None,
            **summary: float) -> Path:
    """The recorded H200 bundle's manifest and metrics with these settings and figures."""
    manifest = json.loads((H200 / "manifest.json").read_text())
    metrics = json.loads((H200 / "metrics.json").read_text())
    cfg = manifest["config"]
    cfg["parallel"] = {**cfg["parallel"], "tp": 1, "pp": 1, "dp": 1, **parallel}
    cfg["micro_batch_size"], cfg["global_batch_size"] = mb, gbs
    cfg["optim"]["recompute"] = recompute
    metrics["summary"].update(summary)
    if devices is not None:
        base = metrics["per_device"][0]
        metrics["per_device"] = [{**copy.deepcopy(base), "device": i, **d}
                                 for i, d in enumerate(devices)]
    out = tmp / name
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "metrics.json").write_text(json.dumps(metrics))
    return out


TP2PP2 = {"tp": 2, "pp": 2, "dp": 1, "sp": True}


def _burst(tmp: Path, name: str, mb: int, gbs: int, ptm: float, tokens: float) -> Path:
    return _derive(tmp, name, parallel=TP2PP2, mb=mb, gbs=gbs, tokens_per_s=tokens,
                   devices=[{"peak_to_mean": ptm}])


def test_burst_verdict_follows_the_micro_batch_count_when_a_fixed_count_stays_flat(tmp_path):
    # Issue 38: at global batch 16, micro-batch 1 -> 8 took peak-to-mean 1.27 -> 1.90 while the
    # micro-batch count fell 16 -> 2. Held at 2 micro-batches, the size alone moves it little.
    fixed_gbs = [_burst(tmp_path, f"g{mb}", mb, 16, ptm, t)
                 for mb, ptm, t in ((1, 1.27, 100.0), (2, 1.40, 95.0), (4, 1.62, 90.0),
                                    (8, 1.90, 78.0))]
    facts = [read_facts(p) for p in fixed_gbs]
    alone = microbatch_bursts(facts)
    assert alone.verdict == "not measurable here"
    assert "no runs at a fixed count" in alone.why
    fixed_count = [_burst(tmp_path, f"c{mb}", mb, 2 * mb, ptm, 60.0)
                   for mb, ptm in ((1, 1.86), (2, 1.88), (4, 1.89))]
    result = microbatch_bursts(facts + [read_facts(p) for p in fixed_count])
    assert result.verdict == "disagrees", result.why
    assert "micro-batch count" in result.why and "1.27 -> 1.90" in result.why
    assert [p["micro_batches"] for p in result.evidence["fixed_global_batch"]] == [16, 8, 4, 2]
    assert [p["micro_batches"] for p in result.evidence["fixed_micro_batch_count"]] == [2] * 4
    assert set(result.bundles) == {p.name for p in fixed_gbs + fixed_count}
    assert len(result.plot.series) == 2


def test_burst_verdict_agrees_when_the_size_itself_makes_it_bursty(tmp_path):
    paths = [_burst(tmp_path, f"g{mb}", mb, 16, ptm, 100.0)
             for mb, ptm in ((1, 1.27), (8, 1.90))]
    paths += [_burst(tmp_path, f"c{mb}", mb, 2 * mb, ptm, 60.0) for mb, ptm in ((1, 1.25),)]
    result = microbatch_bursts([read_facts(p) for p in paths])
    assert result.verdict == "agrees", result.why
    flat = [_burst(tmp_path, f"f{mb}", mb, 16, ptm, 100.0) for mb, ptm in ((1, 1.20), (8, 1.24))]
    assert microbatch_bursts([read_facts(p) for p in flat]).verdict == "disagrees"


def _node(tmp: Path, name: str, parallel: dict[str, Any], temps: list[float],
          thermal: list[float]) -> Path:
    devices = [{"temp_gpu_c_mean": t, "throttle_frac_by_reason": {
        "power_cap": 0.2, "thermal_sw": th, "thermal_hw": 0.0, "hw_slowdown": 0.0,
        "power_brake": 0.0, "other": 0.0}} for t, th in zip(temps, thermal, strict=True)]
    return _derive(tmp, name, parallel=parallel, mb=1, gbs=16, devices=devices)


def test_thermal_verdicts_separate_position_from_load(tmp_path):
    same_order = [
        _node(tmp_path, "tp4", {"tp": 4}, [58, 61, 66, 71], [0, 0, 0, 0.02]),
        _node(tmp_path, "tp2dp2", {"tp": 2, "dp": 2}, [57, 60, 64, 70], [0, 0, 0, 0.03]),
        _node(tmp_path, "pp4", {"pp": 4}, [59, 63, 67, 74], [0, 0, 0.05, 0.4]),
    ]
    facts = [read_facts(p) for p in same_order]
    position = thermal_position(facts)
    assert position.verdict == "agrees", position.why
    assert position.evidence["runs"][0]["hottest_position"] == (0, 3)  # SXM4 of the chassis
    throttle = pp_throttle(facts)
    assert throttle.verdict == "agrees", throttle.why
    assert "power-cap" in throttle.why
    scrambled = [
        _node(tmp_path, "a", {"tp": 4}, [70, 61, 58, 66], [0] * 4),
        _node(tmp_path, "b", {"tp": 2, "dp": 2}, [58, 70, 66, 61], [0] * 4),
        _node(tmp_path, "c", {"pp": 4}, [66, 58, 70, 61], [0] * 4),
    ]
    facts = [read_facts(p) for p in scrambled]
    assert thermal_position(facts).verdict == "disagrees"
    assert pp_throttle(facts).verdict == "disagrees"
    only_pipeline = [read_facts(scrambled[2])]
    assert thermal_position(only_pipeline).verdict == "not measurable here"


def test_thermal_verdicts_compare_only_layouts_that_ran_alike(tmp_path):
    """The same-order layouts above, PP4's facts with execution set to graphed (the recorded
    run is eager; dataclasses.replace): position leaves PP4 out, throttling, which needs it,
    is confounded; two layouts that ran differently are confounded for position too."""
    tp4 = read_facts(_node(tmp_path, "tp4", {"tp": 4}, [58, 61, 66, 71], [0, 0, 0, 0.02]))
    tp2dp2 = read_facts(_node(tmp_path, "tp2dp2", {"tp": 2, "dp": 2}, [57, 60, 64, 70],
                              [0, 0, 0, 0.03]))
    pp4 = replace(read_facts(_node(tmp_path, "pp4", {"pp": 4}, [59, 63, 67, 74],
                                   [0, 0, 0.05, 0.4])), execution=Execution("graphed"))
    position = thermal_position([tp4, tp2dp2, pp4])
    assert position.verdict == "agrees", position.why
    assert position.evidence["left_out"] == ["pp4"] and "pp4" not in position.bundles
    throttle = pp_throttle([tp4, tp2dp2, pp4])
    assert throttle.verdict == "confounded", throttle.why
    assert "execution mode: eager (mixture of experts) (tp4, tp2dp2) vs graphed (pp4)" \
        in throttle.why
    assert throttle.plot is None
    two = thermal_position([tp4, replace(tp2dp2, execution=Execution("graphed"))])
    assert two.verdict == "confounded" and two.differs[0].setting == "execution"


def _with_links(path: Path, gbps: float) -> Path:
    """The recorded bundle's step times, and link counters of 4 GPUs rising at ``gbps``."""
    steps = pq.read_table(H200 / "steps.parquet")
    pq.write_table(steps, path / "steps.parquet")
    t0, t1 = min(steps["t_start"].to_pylist()), max(steps["t_end"].to_pylist())
    times = [t0 + (t1 - t0) * i / 50 for i in range(51)]
    rows = [{"t": t, "source": "gpu", "node": 0, "device": d,
             "link_tx_bytes": int(gbps * 1e9 / 2 * (t - t0)),
             "link_rx_bytes": int(gbps * 1e9 / 2 * (t - t0))} for d in range(4) for t in times]
    pq.write_table(pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA),
                   path / "telemetry.parquet")
    return path


def test_link_verdict_compares_tp_pp_with_tp_only_and_the_fabric_peak(tmp_path):
    tp4 = _with_links(_derive(tmp_path, "tp4", parallel={"tp": 4, "sp": True}, mb=1, gbs=16),
                      60.0)
    low = _with_links(_derive(tmp_path, "low", parallel=TP2PP2, mb=1, gbs=16), 18.0)
    fabric = _derive(tmp_path, "fabric", parallel={"dp": 4}, mb=1, gbs=4)
    (fabric / "fabric.json").write_text(json.dumps({"points": [
        {"op": "all_reduce", "size_bytes": 2**28, "busbw_gbps": 300.0,
         "graph_busbw_gbps": 360.0}]}))
    result = tp_pp_links([read_facts(p) for p in (tp4, low, fabric)])
    assert result.verdict == "agrees", result.why
    assert result.evidence["tp_only"]["link_gbps_per_gpu"] == pytest.approx(60.0, rel=1e-3)
    assert result.evidence["rate_ratio"] == pytest.approx(0.3, rel=1e-3)
    assert result.evidence["fabric_peak_busbw_gbps"] == 360.0
    assert "fabric" in result.bundles
    high = _with_links(_derive(tmp_path, "high", parallel=TP2PP2, mb=1, gbs=16), 55.0)
    assert tp_pp_links([read_facts(p) for p in (tp4, high)]).verdict == "disagrees"


def _estimate_s(text: str) -> int:
    m = re.search(r"estimated (?:(\d+) min )?(\d+) s", text)
    assert m, text
    return int(m.group(1) or 0) * 60 + int(m.group(2))


def test_dry_run_on_cpu_lists_the_matrix(cli):
    r = cli("study", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "study study-cpux2: gpt3-tiny on cpux2" in r.stdout
    assert "tp1-pp2-dp1-recompute-full-nooverlap-mb8-gbs16" in r.stdout
    assert "tp1-pp2-dp1-recompute-full-nooverlap-mb1-gbs2" in r.stdout
    assert "fabric" in r.stdout
    assert "12 points: 12 valid, 0 skipped" in r.stdout


def test_dry_run_for_four_h200s_fits_the_budget(cli):
    full = cli("study", "--dry-run", "--platform", "h200", "--devices", "4")
    assert full.returncode == 0, full.stderr
    assert "gpt3-175b-4l on h200x4" in full.stdout
    for point in ("tp4-pp1-dp1-sp-recompute-full", "tp2-pp2-dp1-sp-recompute-full",
                  "tp1-pp4-dp1-recompute-full", "tp2-pp1-dp2-dist_optimizer-sp-recompute-none",
                  "mb8-gbs16", "mb4-gbs8", "-overlap-"):
        assert point in full.stdout, point
    assert _estimate_s(full.stdout) <= 30 * 60
    quick = cli("study", "--dry-run", "--quick", "--platform", "h200", "--devices", "4")
    assert quick.returncode == 0, quick.stderr
    assert "study study-h200x4-quick" in quick.stdout
    assert _estimate_s(quick.stdout) <= 10 * 60


def test_bad_study_input_is_one_line(cli):
    for args, said in ((["--only", "bursts"], "unknown finding"),
                       (["--devices", "3"], "--devices 3"), (["--platform", "nosuch"], "nosuch"),
                       (["--only", "scale-up"], "no run of this node")):
        r = cli("study", "--dry-run", *args)
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("error: ") and said in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.training
@pytest.mark.timeout(900)
def test_cpu_study_runs_resumes_and_writes_findings_first(cli, tmp_path):
    args = ("study", "--quick", "--only", "microbatch-bursts", "--out", str(tmp_path))
    r = cli(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    folder = Path(r.stdout.strip().splitlines()[-1])
    assert folder == tmp_path.resolve() / "study-cpux2-quick"
    assert "left]" in r.stderr  # each finished point says how long the rest should take
    doc = json.loads((folder / "cpux2-findings.json").read_text())
    entries = {e["finding"]: e for e in doc["findings"]}
    assert list(entries) == list(FINDING_IDS)
    burst = entries["microbatch-bursts"]
    assert burst["verdict"] == "not measurable here" and "power" in burst["why"]
    assert [p["micro_batch"] for p in burst["evidence"]["fixed_global_batch"]] == [1, 8]
    # no power: no peak-to-mean to draw, and no throughput figure standing in for it
    assert not (folder / "findings" / "microbatch-bursts.png").exists()
    html = (folder / "report.html").read_text()
    assert html.count('<h2 id="findings">') == 1
    assert html.index('<h2 id="findings">') < html.index('<h2 id="comparison">')
    assert 'src="findings/microbatch-bursts.png"' not in html
    index = json.loads((folder / "sweep.json").read_text())
    assert [p["status"] for p in index["points"]] == ["ok"] * 3
    again = cli(*args, "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("kept (ok, bundle verifies)") == 3
    refused = cli(*args)  # a study folder, refused in one line before any estimate
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: study folder {tmp_path / 'study-cpux2-quick'} exists; pass --resume to "
        "continue it, or --out another directory"]


# --- study --from ------------------------------------------------------------------------------

def test_study_from_recorded_bundles_writes_findings_and_report(monkeypatch, capsys, tmp_path):
    code, out, err = kit(monkeypatch, capsys, "study", "--from", str(PARALLEL), "--out",
                         str(tmp_path))
    assert code == 0, err
    folder = Path(out.strip().splitlines()[-1])
    assert folder == (tmp_path / "study-h200x1-from-bundles").resolve()
    doc = json.loads((folder / "h200x1-findings.json").read_text())
    entries = {e["finding"]: e for e in doc["findings"]}
    assert list(entries) == list(FINDING_IDS) and doc["unverified"] == {}
    assert entries["recompute-power"]["verdict"] == "disagrees"
    assert entries["recompute-power"]["differs"] == []
    assert "recompute-power" in out and "findings: " in out
    assert (folder / "findings" / "recompute-power.png").is_file()
    html = (folder / "report.html").read_text()
    assert 'src="findings/recompute-power.png"' in html


def test_study_from_refuses_an_unverified_bundle_unless_allowed(monkeypatch, capsys, tmp_path):
    edited = copy_bundle(tmp_path / "in", H200)  # metrics.json changed, checksums not resealed
    metrics = json.loads((edited / "metrics.json").read_text())
    metrics["summary"]["power_w_mean"] *= 0.9
    (edited / "metrics.json").write_text(json.dumps(metrics))
    args = ("study", "--from", str(edited), str(PARALLEL / RECORDED_ON), "--out",
            str(tmp_path / "out"))
    line = one_error(*kit(monkeypatch, capsys, *args)[::2])
    assert edited.name in line and "--allow-unverified" in line
    assert not (tmp_path / "out").exists()
    code, out, err = kit(monkeypatch, capsys, *args, "--allow-unverified")
    assert code == 0, err
    assert f"warning: unverified: {edited.name}" in err
    folder = Path(out.strip().splitlines()[-1])
    doc = json.loads((folder / "h200x1-findings.json").read_text())
    assert list(doc["unverified"]) == [edited.name]
    recompute = next(e for e in doc["findings"] if e["finding"] == "recompute-power")
    assert recompute["verdict"] == "agrees" and recompute["unverified_bundles"] == [edited.name]
    html = (folder / "report.html").read_text()
    assert "<b>Unverified:</b> rests on " + edited.name in html
    assert "failed verification" in html  # the comparison's own check, as compare shows it


def test_study_from_reads_an_unverified_bundles_tables_within_the_budget(monkeypatch, capsys,
                                                                        tmp_path):
    # a table of a million constant rows, a few KB on disk: verification refuses it, and so does
    # the findings' own read of it when --allow-unverified lets the bundle through
    monkeypatch.setenv(BUDGET_ENV, "0.05")
    bundle = constant_rows(copy_bundle(tmp_path / "in", H200), 1_000_000)
    for extra in ((), ("--allow-unverified",)):
        line = one_error(*kit(monkeypatch, capsys, "study", "--from", str(bundle), *extra,
                              "--out", str(tmp_path / "out"))[::2])
        assert "telemetry.parquet has 1000000 rows" in line and BUDGET_ENV in line


def test_bad_study_from_input_is_one_line(monkeypatch, capsys, tmp_path):
    for args, said in ((["--from", str(tmp_path / "nosuch")], "nosuch"),
                       (["--from", str(PARALLEL), "--quick", "--only", "scale-up"],
                        "takes no --quick, --only"),
                       (["--allow-unverified"], "--allow-unverified applies to bundles read "
                                                "with --from"),
                       ([str(PARALLEL)], "follow --from")):
        line = one_error(*kit(monkeypatch, capsys, "study", *args, "--out",
                              str(tmp_path / "out"))[::2])
        assert said in line, line


@pytest.mark.training
def test_study_from_cpu_runs_names_a_confound_and_an_absent_factor(cli, tmp_path,
                                                                   gpt3_tiny_reference):
    # the session's one-process run (recompute none, gpt3-tiny's micro-batch 2, no overlap)
    # beside a run with full recomputation at micro-batch 1 and one with overlap on one replica
    # (profiled: its breakdown is read, a host timeline, which gives no device idle share)
    made = []
    for extra in (["--recompute", "full", "--micro-batch", "1"], ["--overlap", "--profile"]):
        r = cli("run", "gpt3-tiny", "--steps", "2", "--warmup", "1", *extra,
                "--out", str(tmp_path / "runs"))
        assert r.returncode == 0, why_failed(r)
        made.append(bundle_path(r.stdout))
    r = cli("study", "--from", str(gpt3_tiny_reference), *map(str, made), "--out",
            str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    folder = Path(r.stdout.strip().splitlines()[-1])
    doc = json.loads((folder / "cpux1-findings.json").read_text())
    entries = {e["finding"]: e for e in doc["findings"]}
    recompute = entries["recompute-power"]
    assert recompute["verdict"] == "confounded", recompute["why"]
    assert [d["setting"] for d in recompute["differs"]] == ["micro_batch_size"]
    assert f"micro-batch: 2 ({gpt3_tiny_reference.name}) vs 1 ({made[0].name})" \
        in recompute["why"]
    overlap = entries["overlap-power"]
    assert overlap["verdict"] == "not measurable here"
    assert "one data-parallel replica" in overlap["why"]
    profiled = read_facts(made[1])
    assert profiled.exposed_comm_s is not None and profiled.idle_share is None
    assert "confounded" in (folder / "report.html").read_text()
