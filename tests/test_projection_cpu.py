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
from kit.projection.model import project
from kit.projection.request import ProjectionTarget
from kit.projection.sources import measured_run

from .conftest import REPO, bundle_path, kit_cli, why_failed

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
    return statistics.median(_unprofiled_steps(bundle))


def _curve_time(fabric: Path, op: str, size: int) -> float:
    """Seconds of one ``op`` of ``size`` bytes over 2 ranks read off the fabric bundle's curve:
    busbw linear in log(size) between the measured sizes around it, the largest's above, the
    smallest size's time below."""
    points = sorted((q for q in json.loads((fabric / "fabric.json").read_text())["points"]
                     if q["op"] == op), key=lambda q: q["size_bytes"])
    if size < points[0]["size_bytes"]:
        return points[0]["size_bytes"] * bus_factor(op, 2) / (points[0]["busbw_gbps"] * 1e9)
    lo = max((q for q in points if q["size_bytes"] <= size), key=lambda q: q["size_bytes"])
    hi = min((q for q in points if q["size_bytes"] >= size), key=lambda q: q["size_bytes"],
             default=points[-1])
    if hi is lo or hi["size_bytes"] <= size:
        busbw = hi["busbw_gbps"]
    else:
        f = math.log(size / lo["size_bytes"]) / math.log(hi["size_bytes"] / lo["size_bytes"])
        busbw = lo["busbw_gbps"] + f * (hi["busbw_gbps"] - lo["busbw_gbps"])
    return size * bus_factor(op, 2) / (busbw * 1e9)


def _unprofiled_steps(bundle: Path) -> list[float]:
    """Wall time of each measured step the profiler did not record (3 and 4)."""
    rows = pq.read_table(bundle / "steps.parquet").to_pylist()
    spans: dict[int, list[float]] = {}
    for r in rows:
        if r["phase"] == "measured" and r["step"] not in (3, 4):
            spans.setdefault(r["step"], []).extend([r["t_start"], r["t_end"]])
    return [max(v) - min(v) for v in spans.values()]


@pytest.mark.training
@pytest.mark.timeout(900)
def test_a_profiled_run_projected_to_its_own_layout_gives_back_its_step(dp1):
    p = project([dp1], ProjectionTarget(), ["test"])
    measured = _unprofiled_median(dp1)
    low, point, high = p.interval["step_time_s"]
    assert low <= measured <= high
    # compute + idle of 4 micro-batches and the optimizer is the unprofiled step less the
    # measured collectives (the model's own: none over one rank); but the run is eager, paced
    # by its host, and so is its own layout: the point is that host's pace, the whole step
    run = measured_run(read_bundle(dp1))
    assert run.step_s[1] == pytest.approx(measured)
    assert point == pytest.approx(measured)
    assert p.step["host_coupling"] == [1.0, 1.0, 1.0]  # one rank waits on no other
    assert p.collectives == []
    assert p.summary["power_w_mean"] is None  # no RAPL or GPU power on this host
    assert any("power not projected" in a for a in p.assumptions)


@pytest.mark.training
@pytest.mark.timeout(900)
def test_a_dp2_run_projected_to_its_own_layout_lands_in_its_interval(dp2, fabric):
    p = project([dp2, fabric], ProjectionTarget(dp=2), ["test"])
    low, _, high = p.interval["step_time_s"]
    # The compute comes from the run's own profile; the collectives' time from the fabric
    # bundle, measured at another moment (on a busy host, under another load). The step may
    # miss the interval by as much as the two collective times and the spread of the run's own
    # unprofiled steps (another job on the host slows some: 0.18-0.27 s beside the suite's
    # other worker, where the profiled ones took 0.17-0.18), no more.
    run = measured_run(read_bundle(dp2))
    comm = sum(run.parts.communication.values()) + sum(c.exposed_s[2] for c in p.collectives)
    assert comm > 0
    steps = _unprofiled_steps(dp2)
    noise = max(steps) - min(steps)
    assert low - comm - noise <= statistics.median(steps) <= high + comm + noise
    assert [i.role for i in p.inputs] == ["compute", "fabric"]


@pytest.mark.training
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
    assert ar.time_s[1] == pytest.approx(_curve_time(fabric, "all_reduce", ar.size_bytes))
    # without --overlap the reduction is exposed whole, after the pipeline of 2 micro-batches
    st = p.stages[0]
    assert ar.exposed_s == ar.time_s
    assert p.step["pipeline_s"][1] == pytest.approx(2 * st.micro_batch_s[1])
    assert st.tail_s[1] == pytest.approx(ar.time_s[1] + st.optimizer_s)


@pytest.mark.training
@pytest.mark.timeout(900)
def test_an_eager_pipeline_counts_its_p2p_syncs_exchanges_and_bubble_from_its_inputs(dp1, fabric):
    p = project([dp1, fabric], ProjectionTarget(pp=2), ["test"])
    m, (s0, s1) = p.step["micro_batches"], p.stages
    assert m == 4 and p.step["graphed"] is False
    # the exchange: one send/recv of a micro-batch's activations (2 x 128 x 128 x 4 bytes,
    # fp32 on the CPU) per micro-batch on each end stage, its time off the fabric's curve
    ex = [c for c in p.collectives if c.what == "PP activation/gradient exchange"]
    assert [(c.stage, c.calls, c.size_bytes) for c in ex] == [(0, 1, 2 * 128 * 128 * 4),
                                                              (1, 1, 2 * 128 * 128 * 4)]
    for c in ex:
        assert c.time_s[1] == pytest.approx(_curve_time(fabric, "send_recv", c.size_bytes))
    # the sync after each p2p call: up to one layer's device time of the chunk before it (the
    # forward's third on the first stage, the backward's two thirds on the last), half at the
    # point; a layer is half of stage 0's compute (2 layers, no logits)
    layer = s0.compute_s / 2
    assert s0.p2p_sync_s == pytest.approx([0.0, layer / 3 / 2, layer / 3])
    assert s1.p2p_sync_s == pytest.approx([0.0, layer * 2 / 3 / 2, layer * 2 / 3])
    for s in (s0, s1):
        parts = s.compute_s + s.idle_s[1] + s.blocking_comm_s[1]
        # the host floor (the eager run's whole micro-batch per layer) may only raise it
        assert s.micro_batch_s[1] >= parts + s.p2p_sync_s[1] - 1e-12
    # 1F1B: m times the slowest stage plus the others once; the bubble is what that adds
    t = [s.micro_batch_s[1] for s in p.stages]
    assert p.step["pipeline_s"][1] == pytest.approx(m * max(t) + sum(t) - max(t))
    assert p.step["bubble_s"] == pytest.approx(sum(t) - max(t))
    # two host-paced ranks wait on each other: the step is the pipeline and the slower tail
    # times the mean of the slower of two draws from the run's unprofiled steps over their
    # median (never below 1: a busy host's few steps can put it there); low: every host at the
    # median; high: the slowest step
    steps = _unprofiled_steps(dp1)
    median = statistics.median(steps)
    slower = statistics.mean(max(a, b) for a in steps for b in steps)
    coupling = max(1.0, slower / median)
    assert p.step["host_coupling"] == pytest.approx([1.0, coupling, max(steps) / median])
    tail = max(s.tail_s[1] for s in p.stages)
    assert p.summary["step_time_s"] == pytest.approx((p.step["pipeline_s"][1] + tail) * coupling)
    assert any("batch_p2p_sync" in a for a in p.assumptions)
    assert any("2 host-paced ranks wait on each other" in a for a in p.assumptions)


@pytest.mark.training
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


@pytest.fixture(scope="module")
def gemm_table(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gemm") / "cpu.gemm.json"
    r = kit_cli("platforms", "gemm", "--platform", "cpu", "--workload", "gpt3-tiny",
                "--tp", "1,2", "--micro-batch", "2", "--min-time-ms", "2", "-o", str(out))
    assert r.returncode == 0, why_failed(r)
    assert r.stdout.strip().splitlines()[-1] == str(out.resolve())
    return out


def test_the_gemm_table_holds_every_layer_gemm_of_each_tp_degree(gemm_table):
    table = json.loads(gemm_table.read_text())
    assert (table["kind"], table["platform"], table["dtype"]) == ("charllm-kit gemm table",
                                                                  "cpu", "fp32")
    shapes = {(p["pass"], p["m"], p["n"], p["k"]) for p in table["points"]}
    tokens, h, ffn, vocab = 2 * 128, 128, 512, 1024  # gpt3-tiny, micro-batch 2
    for t in (1, 2):
        for d_in, d_out in ((h, 3 * h // t), (h // t, h), (h, ffn // t), (ffn // t, h),
                            (h, vocab // t)):
            assert ("forward", tokens, d_out, d_in) in shapes
            assert ("dgrad", tokens, d_in, d_out) in shapes
            assert ("wgrad", d_out, d_in, tokens) in shapes
    for p in table["points"]:
        assert p["tflops"] == pytest.approx(2 * p["m"] * p["n"] * p["k"] / p["time_s"] / 1e12)


@pytest.mark.training
@pytest.mark.timeout(900)
def test_a_gemm_table_scales_matmul_by_the_shards_efficiency_and_is_named(dp1, fabric,
                                                                          gemm_table):
    from kit.config.run import RunConfig
    from kit.projection.gemm import read_gemm_table, stage_gemms

    own = project([dp1, gemm_table], ProjectionTarget(), ["test"])
    plain = project([dp1], ProjectionTarget(), ["test"])
    assert own.summary["step_time_s"] == pytest.approx(plain.summary["step_time_s"])
    tp2 = project([dp1, fabric, gemm_table], ProjectionTarget(tp=2, sp=True), ["test"])
    flat = project([dp1, fabric], ProjectionTarget(tp=2, sp=True), ["test"])
    table = read_gemm_table(gemm_table)
    source = RunConfig.model_validate(read_bundle(dp1).manifest.config)
    target = RunConfig.model_validate(tp2.config)
    ratio = (table.efficiency_tflops(stage_gemms(source, 0))
             / table.efficiency_tflops(stage_gemms(target, 0)))
    got = tp2.stages[0].compute_by_category_s["MatMul"]
    assert got == pytest.approx(flat.stages[0].compute_by_category_s["MatMul"] * ratio)
    assert tp2.source_kind == "cpu"
    assert [i.role for i in tp2.inputs] == ["compute", "fabric", "gemm"]
    assert tp2.provenance["links"].startswith("measured fabric bundle of cpu")
    assert "measured GEMM table cpu.gemm.json" in tp2.provenance["matmul_efficiency"]
    assert flat.provenance["matmul_efficiency"].startswith("assumed: no GEMM table of cpu")
    assert any("no GEMM table of cpu" in a for a in flat.assumptions)
    shares = tp2.step["bound_shares"]  # the slowest stage's step, split four ways
    assert sum(shares.values()) == pytest.approx(1.0)
    assert tp2.step["bound"] == max(("compute", "memory", "link"), key=shares.get)


@pytest.mark.training
@pytest.mark.timeout(900)
@pytest.mark.parametrize("extra, needle", [
    ((), "no GEMM table of cpu and mi250"),
    (("GEMM",), "no GEMM table of mi250"),
])
def test_another_gpu_kind_without_what_it_needs_is_refused(dp1, gemm_table, tmp_path, extra,
                                                          needle):
    given = [str(gemm_table) if e == "GEMM" else e for e in extra]
    r = kit_cli("project", str(dp1), *given, "--platform", "mi250", "--devices-per-node", "1",
                "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")
    assert not (tmp_path / "o").exists()


def _cpu_kind(folder: Path, name: str, bandwidth: float, peak: float) -> Path:
    """The cpu profile under another name with datasheet figures: a second 'GPU kind'."""
    import yaml

    spec = yaml.safe_load((REPO / "platforms/cpu.yaml").read_text())
    spec.update(name=name, memory_bandwidth_gbps=bandwidth, peak_tflops={"fp32": peak})
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.training
@pytest.mark.timeout(900)
def test_across_kinds_memory_bound_kernels_follow_the_bandwidth_and_gemms_the_tables(
        tmp_path_factory):
    from kit.config.run import RunConfig
    from kit.projection.gemm import read_gemm_table, stage_gemms

    folder = tmp_path_factory.mktemp("kinds")
    kind_a, kind_b = _cpu_kind(folder, "cpua", 100.0, 1.0), _cpu_kind(folder, "cpub", 400.0, 2.0)
    tables = []
    for kind in (kind_a, kind_b):
        table = folder / f"{kind.stem}.gemm.json"
        r = kit_cli("platforms", "gemm", "--platform", str(kind), "--workload", "gpt3-tiny",
                    "--tp", "1", "--micro-batch", "2", "--min-time-ms", "2", "-o", str(table))
        assert r.returncode == 0, why_failed(r)
        tables.append(table)
    run = _run(tmp_path_factory, "cpua", "run", "gpt3-tiny", "--platform", str(kind_a), *STEPS)
    r = kit_cli("project", str(run), "--platform", str(kind_b), "--out", str(folder / "none"))
    assert r.returncode == 2 and "no GEMM table of cpua and cpub" in r.stderr, r.stderr
    same = project([run, *tables], ProjectionTarget(), ["test"])
    other = project([run, *tables], ProjectionTarget(platform=str(kind_b)), ["test"])
    assert (same.source_kind, other.source_kind) == ("cpua", "cpua")
    assert other.config["platform"]["name"] == "cpub"
    a, b = same.stages[0].compute_by_category_s, other.stages[0].compute_by_category_s
    # The optimizer's timed step is taken out of elementwise/memory and other first: on a busy
    # host it can hold them whole and they drop out; norm is never taken.
    memory_bound = [cat for cat in ("norm", "elementwise/memory", "other") if cat in a]
    assert "MatMul" in a and "norm" in memory_bound, sorted(a)
    for cat in memory_bound:
        assert set(b) == set(a) and b[cat] == pytest.approx(a[cat] * 100 / 400)
    if "attention" in a:
        assert b["attention"] == pytest.approx(a["attention"] / 2)
    cfg = RunConfig.model_validate(same.config)
    gemms = stage_gemms(cfg, 0)
    ratio = (read_gemm_table(tables[0]).efficiency_tflops(gemms)
             / read_gemm_table(tables[1]).efficiency_tflops(gemms))
    assert b["MatMul"] == pytest.approx(a["MatMul"] * ratio)
    assert other.stages[0].optimizer_s == pytest.approx(same.stages[0].optimizer_s / 4)
    assert other.provenance["memory_bound"] == "datasheet memory bandwidth 100 -> 400 GB/s"
    assert other.provenance["matmul_efficiency"] == ("measured GEMM table cpua.gemm.json -> "
                                                     "cpub.gemm.json")
    assert [i.role for i in other.inputs] == ["compute", "gemm", "gemm"]
