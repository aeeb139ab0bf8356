"""`charllm-kit project` on real gloo runs: profiled gpt3-tiny runs and a 2-rank fabric bundle
made here, projected to their own layouts and to others, the times read off the fabric curve."""

import json
import math
import statistics
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kit.bundle.reader import read_bundle
from kit.fabric.bandwidth import bus_factor
from kit.project.model import project
from kit.project.request import ProjectionTarget
from kit.project.sources import measured_run

from .conftest import bundle_path, kit_cli, why_failed

STEPS = ("--steps", "6", "--warmup", "2", "--profile-steps", "3:5")


def _run(tmp_path_factory, name: str, *args: str) -> Path:
    out = tmp_path_factory.mktemp(name)
    r = kit_cli(*args, "--out", str(out), timeout=600)
    assert r.returncode == 0, why_failed(r)
    return bundle_path(r.stdout)


@pytest.fixture(scope="module")
def dp1(tmp_path_factory) -> Path:
    return _run(tmp_path_factory, "dp1", "run", "gpt3-tiny", *STEPS)


@pytest.fixture(scope="module")
def dp2(tmp_path_factory) -> Path:
    return _run(tmp_path_factory, "dp2", "run", "gpt3-tiny", "--dp", "2", *STEPS)


@pytest.fixture(scope="module")
def fabric(tmp_path_factory) -> Path:
    return _run(tmp_path_factory, "fabric", "fabric", "--nproc", "2")


def _unprofiled_median(bundle: Path) -> float:
    """Median wall time of the measured steps the profiler did not record (3 and 4)."""
    rows = pq.read_table(bundle / "steps.parquet").to_pylist()
    spans: dict[int, list[float]] = {}
    for r in rows:
        if r["phase"] == "measured" and r["step"] not in (3, 4):
            spans.setdefault(r["step"], []).extend([r["t_start"], r["t_end"]])
    return statistics.median(max(v) - min(v) for v in spans.values())


@pytest.mark.timeout(900)
def test_a_profiled_run_projected_to_its_own_layout_gives_back_its_step(dp1):
    p = project([dp1], ProjectionTarget(), ["test"])
    measured = _unprofiled_median(dp1)
    low, point, high = p.interval["step_time_s"]
    assert low <= measured <= high
    # compute + idle of 4 micro-batches and the optimizer: the unprofiled step less the
    # measured collectives, which the model replaces by its own (none over one rank)
    run = measured_run(read_bundle(dp1))
    assert run.step_s[1] == pytest.approx(measured)
    assert point == pytest.approx(measured - sum(run.parts.communication.values()))
    assert p.collectives == []
    assert p.summary["power_w_mean"] is None  # no RAPL or GPU power on this host
    assert any("power not projected" in a for a in p.assumptions)


@pytest.mark.timeout(900)
def test_a_dp2_run_projected_to_its_own_layout_lands_in_its_interval(dp2, fabric):
    p = project([dp2, fabric], ProjectionTarget(dp=2), ["test"])
    low, _, high = p.interval["step_time_s"]
    # The compute comes from the run's own profile; the collectives' time from the fabric
    # bundle, measured at another moment (on a busy host, under another load). The step may
    # miss the interval by as much as the two collective times, no more.
    run = measured_run(read_bundle(dp2))
    comm = sum(run.parts.communication.values()) + sum(c.exposed_s[2] for c in p.collectives)
    assert comm > 0
    assert low - comm <= _unprofiled_median(dp2) <= high + comm
    assert [i.role for i in p.inputs] == ["compute", "fabric"]


@pytest.mark.timeout(900)
def test_the_dp_all_reduce_takes_its_size_over_the_fabric_curves_busbw(dp1, fabric):
    p = project([dp1, fabric], ProjectionTarget(dp=2), ["test"])
    ar = next(c for c in p.collectives if c.what == "DP gradient all-reduce")
    # gpt3-tiny's parameters in fp32 gradients: 4 layers of 2 LayerNorms (2 x 2 x 128), QKV
    # and projection (4 x 128^2 + 4 x 128 biases), MLP (2 x 128 x 512 + 512 + 128); the
    # embedding 1024 x 128, positions 128 x 128, the final LayerNorm 2 x 128
    layer = 4 * 128 + 4 * 128 * 128 + 4 * 128 + 2 * 128 * 512 + 512 + 128
    params = 4 * layer + 1024 * 128 + 128 * 128 + 2 * 128
    assert ar.size_bytes == params * 4
    points = sorted((q for q in json.loads((fabric / "fabric.json").read_text())["points"]
                     if q["op"] == "all_reduce"), key=lambda q: q["size_bytes"])
    lo = max((q for q in points if q["size_bytes"] <= ar.size_bytes),
             key=lambda q: q["size_bytes"])
    hi = min((q for q in points if q["size_bytes"] >= ar.size_bytes),
             key=lambda q: q["size_bytes"], default=points[-1])
    if hi is lo or hi["size_bytes"] <= ar.size_bytes:
        busbw = hi["busbw_gbps"]
    else:
        f = math.log(ar.size_bytes / lo["size_bytes"]) / math.log(
            hi["size_bytes"] / lo["size_bytes"])
        busbw = lo["busbw_gbps"] + f * (hi["busbw_gbps"] - lo["busbw_gbps"])
    assert ar.time_s[1] == pytest.approx(ar.size_bytes * bus_factor("all_reduce", 2)
                                         / (busbw * 1e9))
    # without --overlap the reduction is exposed whole, after the pipeline of 2 micro-batches
    st = p.stages[0]
    assert ar.exposed_s == ar.time_s
    assert p.step["pipeline_s"][1] == pytest.approx(2 * st.micro_batch_s[1])
    assert st.tail_s[1] == pytest.approx(ar.time_s[1] + st.optimizer_s)


@pytest.mark.timeout(900)
def test_the_cli_writes_a_projection_compare_reads_and_a_fabric_alone_is_refused(
        dp1, fabric, tmp_path):
    r = kit_cli("project", str(dp1), str(fabric), "--tp", "2", "--sp", "--out", str(tmp_path),
                "--json")
    assert r.returncode == 0, why_failed(r)
    out = json.loads(r.stdout)
    assert out["projected"] is True and Path(out["file"]).is_file()
    assert {c["what"] for c in out["collectives"]} >= {"SP all-gather", "SP reduce-scatter"}
    r = kit_cli("run", "gpt3-tiny", "--tp", "2", "--sp", "--dry-run", "--json")
    assert r.returncode == 0, why_failed(r)
    stages = json.loads(r.stdout)["memory_estimate"]["stages"]  # what --dry-run shows
    assert out["memory"]["total_gib"] == max(s["total_bytes"] for s in stages) / 2**30
    r = kit_cli("compare", str(dp1), out["file"], "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert "[projected]" in r.stdout and "PROJECTED, not measured" in r.stderr
    r = kit_cli("compare", str(dp1), out["file"])
    memory = next(ln for ln in r.stdout.splitlines() if ln.startswith("peak memory"))
    assert memory.count("(estimate)") == 1, memory  # the projection's, not the measured one
    r = kit_cli("project", str(fabric), "--out", str(tmp_path / "none"))
    assert r.returncode == 2 and "no run bundle given" in r.stderr
    assert not (tmp_path / "none").exists()
