"""`charllm-kit fabric` on real gloo ranks: nccl-tests' algbw/busbw arithmetic on what was
measured, a bundle with telemetry, and compare/report showing its curve."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kit.bundle.verify import verify_bundle
from kit.fabric.bandwidth import bus_factor, message_bytes
from kit.fabric.timing import iterations_for
from kit.launch.local import free_port

from .conftest import REPO, bundle_path, kit_cli, why_failed


def test_bus_factors_are_nccl_tests():
    n = 8
    assert bus_factor("all_reduce", n) == 2 * 7 / 8
    assert bus_factor("all_gather", n) == bus_factor("reduce_scatter", n) == 7 / 8
    assert bus_factor("all_to_all", n) == 7 / 8
    assert bus_factor("send_recv", n) == 1
    assert message_bytes("all_gather", 4096, 3) == 4092  # equal fp32 shards for 3 ranks
    assert message_bytes("all_reduce", 4097, 3) == 4096


def test_small_messages_get_more_iterations():
    """Enough to move 64 MiB, from --iters up to 50 x --iters."""
    assert [iterations_for(size, 20) for size in (8, 64 << 10, 1 << 20, 4 << 20, 1 << 30)] == [
        1000, 1000, 64, 20, 20]
    assert iterations_for(1 << 20, 100) == 100


@pytest.fixture(scope="module")
def fabric(tmp_path_factory) -> Path:
    """Three ranks, so each op's bus factor differs from 1 and from the others."""
    out = tmp_path_factory.mktemp("fabric")
    r = kit_cli("fabric", "--nproc", "3", "--sizes", "4K,256K", "--iters", "2", "--warmup",
                "1", "--telemetry-interval-ms", "10", "--out", str(out), timeout=300)
    assert r.returncode == 0, why_failed(r)
    assert "busbw (GB/s)" in r.stdout
    return bundle_path(r.stdout)


@pytest.mark.training
@pytest.mark.timeout(300)
def test_fabric_bandwidths_follow_nccl_tests_from_the_measured_times(fabric):
    verify_bundle(fabric)
    results = json.loads((fabric / "fabric.json").read_text())
    assert (results["ranks"], results["backend"], results["iterations"]) == (3, "gloo", 2)
    assert results["graph"] is False  # CUDA graphs need CUDA devices
    factors = {"all_reduce": 4 / 3, "all_gather": 2 / 3, "reduce_scatter": 2 / 3,
               "all_to_all": 2 / 3, "send_recv": 1.0}
    sizes = {"all_reduce": [4096, 262144], "send_recv": [4096, 262144]}
    seen = set()
    for p in results["points"]:
        seen.add(p["op"])
        assert p["size_bytes"] in sizes.get(p["op"], [4092, 262140])
        assert p["iterations"] == 100  # small messages: 50 x --iters (kit.fabric.timing)
        assert 0 < p["time_s"] <= p["time_s_max"]
        assert p["algbw_gbps"] == pytest.approx(p["size_bytes"] / p["time_s"] / 1e9)
        assert p["busbw_gbps"] == pytest.approx(p["algbw_gbps"] * factors[p["op"]])
        assert p["graph_time_s"] is p["graph_busbw_gbps"] is None
        # rank 0's own timed window holds its iterations: its mean is one of the three ranks'
        # means, so it is at most the slowest and at least 3 * mean - 2 * slowest
        rank0 = (p["t_end"] - p["t_start"]) / p["iterations"]
        assert 3 * p["time_s"] - 2 * p["time_s_max"] - 1e-9 <= rank0 <= p["time_s_max"] + 1e-9
    assert seen == set(factors)
    m = json.loads((fabric / "manifest.json").read_text())
    assert m["workload"]["family"] == "fabric" and m["status"] == "ok"
    assert pq.read_table(fabric / "telemetry.parquet").num_rows > 0  # host telemetry


@pytest.mark.training
@pytest.mark.timeout(300)
def test_compare_and_report_show_the_fabric_curve(fabric, tmp_path):
    r = kit_cli("compare", str(fabric), "--format", "json")
    assert r.returncode == 0, why_failed(r)
    out = json.loads(r.stdout)
    assert [f["bundle"] for f in out["fabric"]] == [fabric.name]
    assert not any(c["kind"] == "partial" for c in out["checks"])
    report = tmp_path / "r.html"
    r = kit_cli("report", str(fabric), "-o", str(report))
    assert r.returncode == 0, why_failed(r)
    assert 'id="fabric-busbw"' in report.read_text()


@pytest.mark.training
@pytest.mark.timeout(600)
def test_a_fabric_bundle_beside_a_run_is_named_as_collectives_not_a_batch(fabric, cpu_bundle):
    """A fabric bundle trains nothing: it is no layout, batch, engine or architecture to flag
    against a training run's; its n/a stays in its own row of the bars, off the x-axis."""
    from kit.analysis.compare import compare_bundles
    from kit.analysis.plots_cross import configuration_bars

    r = kit_cli("compare", str(cpu_bundle), str(fabric), "--format", "json")
    assert r.returncode == 0, why_failed(r)
    out = json.loads(r.stdout)
    labels = [g["label"] for g in out["groups"]]
    assert labels[1].startswith("fabric cpu x3") and labels[1].endswith("collectives"), labels
    assert "gb" not in labels[1] and "megatron" not in labels[1]
    assert not {c["kind"] for c in out["checks"]} & {"batch", "engine", "workload"}, out["checks"]
    fig = configuration_bars(compare_bundles([cpu_bundle, fabric]))
    for ax in fig.axes:
        bottom, top = ax.get_ylim()
        for text in ax.texts:  # each row's label sits half a row or more from the axis
            assert min(bottom, top) + 0.4 < text.get_position()[1] < max(bottom, top) - 0.4


@pytest.mark.parametrize("args, needle", [
    (["--ops", "all_reduce,bogus"], "--ops: unknown collective 'bogus'"),
    (["--nproc", "1"], "at least 2 ranks"),
    (["--sizes", "4X"], "--sizes: size '4X'"),
    (["--nodes", "2"], "--nodes 2 needs --launcher torchrun"),
    (["--launcher", "torchrun", "--nodes", "2"], "--node-rank"),
])
def test_bad_fabric_input_is_one_line_and_exit_2(args, needle):
    r = kit_cli("fabric", *args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and needle in r.stderr


@pytest.mark.training
def test_export_mllog_of_a_fabric_bundle_is_one_line_and_exit_2(fabric, tmp_path):
    """MLLOG describes training runs; a fabric bundle has no model, steps or loss to log."""
    out = tmp_path / "run.log"
    r = kit_cli("bundle", "export-mllog", str(fabric), "-o", str(out))
    assert r.returncode == 2 and not out.exists()
    assert r.stderr.strip().splitlines() == [
        f"error: {fabric.name} is a fabric benchmark (collectives, no model); MLLOG describes "
        "training runs"]


@pytest.mark.training
@pytest.mark.timeout(300)
def test_two_nodes_through_torchrun_make_one_fabric_bundle(tmp_path):
    """The same launchers as training: 2 nodes x 2 ranks on this host, one bundle with both
    nodes' inventories and telemetry, bus factors for 4 ranks."""
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "kit", "fabric", "--nodes", "2", "--nproc", "2", "--launcher",
         "torchrun", "--node-rank", str(node), "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--ops", "all_reduce,all_gather", "--sizes", "64K", "--iters", "3", "--warmup", "1",
         "--telemetry-interval-ms", "10", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        start_new_session=True) for node in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    bundle = bundle_path(outs[0][0])
    verify_bundle(bundle)
    results = json.loads((bundle / "fabric.json").read_text())
    assert results["ranks"] == 4 and {p["op"] for p in results["points"]} == {
        "all_reduce", "all_gather"}
    for p in results["points"]:
        factor = 2 * 3 / 4 if p["op"] == "all_reduce" else 3 / 4
        assert p["busbw_gbps"] == pytest.approx(p["algbw_gbps"] * factor)
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["status"] == "ok" and len(m["inventory"]) == 2
    assert [r["node"] for r in m["ranks"]] == [0, 0, 1, 1]
    nodes = set(pq.read_table(bundle / "telemetry.parquet").column("node").to_pylist())
    assert nodes == {0, 1}
