"""The study's matrix is comparable by construction, and its time estimate learns (issue 58).

Through ``study --dry-run`` (any platform resolves on this CPU host) and the public matrix and
plan functions: the model fits every point of every finding or a finding is dropped whole,
one execution mode per finding, no overlap points where there is nothing to overlap, the
warm-up check on recorded GPU bundles, and an estimate that follows the node's own bundles
(recorded H100 bundles with their pace changed, as tests/test_study.py derives its cases).
"""
# ruff: noqa: D103  (test names say what they check)

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from kit.engines import engine_spec
from kit.plan import plan_run
from kit.plan.resolve import RunRequest
from kit.study.matrix import build_matrix, detect_node
from kit.study.warmup import check_warmup, rerun_values
from tests.conftest import REPO

H100 = REPO / "tests/data/bundles/20261122T094016Z-gpt3-1.3b-h100-e955a2"
"""One H100, gpt3-1.3b, 3 warmup steps: its first measured step within 3% of the median."""
MIXTRAL = REPO / "tests/data/bundles/parallel/20261124T201036Z-mixtral-8x7b-4l-h200-4a76f4"
"""One H200, Mixtral 8x7B (4 layers), eager, 2 warmup: first measured step 1.136 s against a
median of 1.032 s."""


def _point_ids(stdout: str) -> list[str]:
    return re.findall(r"^(\d{3}-\S+)", stdout, re.MULTILINE)


def _estimate_s(text: str) -> int:
    m = re.search(r"estimated (?:(\d+) min )?(\d+) s", text)
    assert m, text
    return int(m.group(1) or 0) * 60 + int(m.group(2))


def test_one_h200_takes_the_model_every_point_fits(cli):
    for form in ((), ("--quick",)):
        r = cli("study", "--dry-run", *form, "--platform", "h200", "--devices", "1")
        assert r.returncode == 0, r.stderr
        # gpt3-175b-4l fits micro-batch 1 but its micro-batch 8 needs 147 GiB: not taken
        assert "gpt3-2.7b on h200x1" in r.stdout
        assert " 0 skipped" in r.stdout and "skipped  " not in r.stdout
        assert any("mb8-gbs16" in p for p in _point_ids(r.stdout))


def _small_h100(tmp: Path, gib: float) -> Path:
    spec = yaml.safe_load((REPO / "platforms/h100.yaml").read_text())
    spec.update(name="h100small", memory_per_device_gib=gib, devices_per_node=1,
                chassis=spec["chassis"][:1])
    path = tmp / f"h100small-{gib:g}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_finding_no_model_fits_whole_is_dropped_with_all_its_points(cli, tmp_path):
    # 28 GiB: gpt3-1.3b holds the recomputation pair (micro-batch 1) but not micro-batch 8
    r = cli("study", "--dry-run", "--quick", "--platform", str(_small_h100(tmp_path, 28)))
    assert r.returncode == 0, r.stderr
    assert "gpt3-1.3b on h100smallx1" in r.stdout
    ids = _point_ids(r.stdout)
    assert ids and all("recompute-" in p for p in ids)
    assert "microbatch-bursts" not in "\n".join(ln for ln in r.stdout.splitlines()
                                                if ln[:3].isdigit())
    dropped = [ln for ln in r.stdout.splitlines()
               if ln.startswith("not measurable here: microbatch-bursts:")]
    assert len(dropped) == 1 and "no study model fits all its points" in dropped[0]
    assert "micro-batch 8" in dropped[0] and "of 28.0 GiB" in dropped[0]
    assert " 0 skipped" in r.stdout
    # 24 GiB: nothing of any finding fits; one error line
    none = cli("study", "--dry-run", "--quick", "--platform", str(_small_h100(tmp_path, 24)))
    assert none.returncode == 2
    assert none.stderr.startswith("error: no finding of the study can run on h100smallx1")
    assert len(none.stderr.strip().splitlines()) == 1


def test_overlap_runs_only_where_there_is_communication_to_hide(cli):
    one = cli("study", "--dry-run", "--quick", "--platform", "h100", "--devices", "1")
    assert one.returncode == 0, one.stderr
    assert not [p for p in _point_ids(one.stdout) if "-overlap-" in p]
    assert re.search(r"^not measurable here: overlap-power: one device: no gradient reduction",
                     one.stdout, re.MULTILINE)
    for devices in ("2", "4", "8"):
        r = cli("study", "--dry-run", "--platform", "h200", "--devices", devices)
        assert r.returncode == 0, r.stderr
        overlapped = [p for p in _point_ids(r.stdout) if "-overlap-" in p]
        assert len(overlapped) == 2, r.stdout
        # the pair's layout reduces gradients over data parallelism: something to overlap
        assert all("-dp2-dist_optimizer" in p for p in overlapped)
        assert "not measurable here: overlap-power" not in r.stdout


@pytest.mark.parametrize("platform,devices", [("h100", 1), ("h200", 2), ("h100", 4),
                                              ("h200", 8), ("cpu", 2)])
@pytest.mark.parametrize("quick", [True, False])
def test_every_point_of_a_finding_runs_in_one_execution_mode(platform, devices, quick):
    matrix = build_matrix(detect_node(platform, devices), quick)
    modes: dict[str, set[str]] = {}
    for point in matrix.points:
        cfg = plan_run(RunRequest(**{**matrix.base, **point.values}), require_present=False).cfg
        mode = engine_spec(cfg.engine).execution(cfg).mode
        for finding_id in point.findings:
            modes.setdefault(finding_id, set()).add(mode)
    assert modes and set(modes) == set(matrix.execution)
    for finding_id, seen in modes.items():
        assert seen == {matrix.execution[finding_id].mode}, (finding_id, seen)
    if platform != "cpu" and devices > 1:
        # a pipeline cannot be graphed: the layouts run eager, TP only held eager to match
        layouts = matrix.execution["thermal-position"]
        assert layouts.mode == "eager" and f"tp{devices}-pp1-dp1-sp" in layouts.held_eager
        assert matrix.execution["recompute-power"].mode == "graphed"
    if platform != "cpu" and devices == 1:
        assert {m.mode for m in matrix.execution.values()} == {"graphed"}


def test_the_dry_run_names_each_finding_s_mode_and_the_held_points(cli):
    r = cli("study", "--dry-run", "--platform", "h200", "--devices", "4")
    assert r.returncode == 0, r.stderr
    ids = _point_ids(r.stdout)
    held = [p for p in ids if "-eager" in p]
    assert {p.split("-recompute")[0] for p in held} == {"001-tp4-pp1-dp1-sp",
                                                        "004-tp2-pp1-dp2-dist_optimizer-sp"}
    assert not [p for p in held if "pp2" in p or "pp4" in p]
    assert re.search(r"^execution: thermal-position, pp-throttle, tp-pp-links, "
                     r"thermal-placement: eager \(pipeline parallelism without graph_pipeline; "
                     r"tp4-pp1-dp1-sp, tp2-pp1-dp2-sp run with --eager to match\)$",
                     r.stdout, re.MULTILINE)
    assert re.search(r"^execution: recompute-power, overlap-power: graphed$", r.stdout,
                     re.MULTILINE)
    assert "8 measured + 3 warmup steps per point" in r.stdout


def test_warmup_check_on_recorded_gpu_bundles():
    steady = check_warmup("p1", H100)
    assert steady is not None and steady.ok and steady.warmup == 3
    assert steady.first_s == pytest.approx(0.629, abs=0.001)
    slow = check_warmup("p2", MIXTRAL)
    assert slow is not None and not slow.ok and slow.warmup == 2
    assert slow.excess == pytest.approx(0.10, abs=0.01)
    assert "against a median of 1.03 s (+10%) after 2 warmup" in slow.describe()
    assert rerun_values({"tp": 1, "micro_batch_size": 8}, slow.warmup) == {
        "tp": 1, "micro_batch_size": 8, "warmup": 4}
    assert json.loads(json.dumps(slow.as_json()))["ok"] is False


def _node_bundle(out: Path, name: str, *, mfu: float, lifecycle: dict | None = None,
                 platform: str = "h100") -> Path:
    """The recorded one-H100 bundle, at another pace, in a study folder of ``out``."""
    point = out / "study-h100x1-quick" / f"00{len(list(out.rglob('manifest.json'))) + 1}-pt"
    bundle = point / name
    bundle.mkdir(parents=True)
    manifest = json.loads((H100 / "manifest.json").read_text())
    metrics = json.loads((H100 / "metrics.json").read_text())
    manifest["config"]["platform"]["name"] = platform
    metrics["summary"]["mfu"] = mfu
    if lifecycle is not None:
        metrics["lifecycle"] = lifecycle
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    (bundle / "metrics.json").write_text(json.dumps(metrics))
    shutil.copy(H100 / "steps.parquet", bundle / "steps.parquet")
    return bundle


def _pace_line(stdout: str) -> str:
    return stdout.strip().splitlines()[-1]


def test_the_estimate_follows_the_node_s_own_bundles(cli, tmp_path):
    args = ("study", "--dry-run", "--quick", "--platform", "h100", "--devices", "1", "--out")
    cold = cli(*args, str(tmp_path / "none"))
    assert cold.returncode == 0, cold.stderr
    assert "start-up 17 s per point, MFU 0.47 (platform h100's study_pace)" in _pace_line(
        cold.stdout)
    # a slower node: MFU 0.2, and 60 s from launch to the first step's end
    slow = tmp_path / "slow"
    _node_bundle(slow, "b1", mfu=0.2, lifecycle={"launch_to_first_step_end_s": 60.0,
                                                 "last_step_to_assembly_s": 1.0})
    learned = cli(*args, str(slow))
    assert learned.returncode == 0, learned.stderr
    line = _pace_line(learned.stdout)
    assert "MFU 0.20" in line and f"1 bundle of {slow / 'study-h100x1-quick'}" in line
    startup = float(re.search(r"start-up (\d+) s", line).group(1))
    assert startup >= 61  # its launch and tail, and any steps after the first beyond the median
    assert _estimate_s(learned.stdout) > _estimate_s(cold.stdout)
    # the point ids do not follow the learned pace (--resume must find the same points)
    assert _point_ids(learned.stdout) == _point_ids(cold.stdout)
    # a faster node, its bundles from before the lifecycle record: MFU learned, start-up not
    fast = tmp_path / "fast"
    _node_bundle(fast, "b1", mfu=0.9)
    _node_bundle(fast, "b2", mfu=0.8)
    _node_bundle(fast, "b3", mfu=0.1, platform="h200")  # another platform's: not this node's
    quick = cli(*args, str(fast))
    assert quick.returncode == 0, quick.stderr
    line = _pace_line(quick.stdout)
    assert "start-up 17 s per point, MFU 0.85 (2 bundles of" in line  # the median of 0.9, 0.8
    assert _estimate_s(quick.stdout) < _estimate_s(cold.stdout)
