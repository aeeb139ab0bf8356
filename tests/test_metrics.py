"""Summary metrics against values computed by hand."""

import pyarrow as pa
import pytest

from kit.analysis.metrics import in_windows, power_summary, step_spans, summarize
from kit.bundle.schema import STEPS_SCHEMA, TELEMETRY_SCHEMA
from kit.spec.resolve import RunRequest, resolve
from kit.telemetry.fields import make_row


def steps(rows):
    return pa.Table.from_pylist(
        [dict(zip(("step", "rank", "phase", "t_start", "t_end"), r, strict=True),
              tokens=256, loss=1.0, stage=0) for r in rows],
        schema=STEPS_SCHEMA,
    )


def test_step_span_is_earliest_start_to_latest_end():
    t = steps([(0, 0, "warmup", 0.0, 1.0), (1, 0, "measured", 1.0, 2.0),
               (1, 1, "measured", 1.1, 2.5), (2, 0, "measured", 2.5, 3.0),
               (2, 1, "measured", 2.6, 3.2)])
    assert step_spans(t) == {1: (1.0, 2.5), 2: (2.5, 3.2)}


def test_in_windows():
    assert in_windows([0.5, 1.0, 1.5, 2.2, 3.0, 9.0], [(2.0, 3.0), (1.0, 1.5)]) == [
        False, True, True, True, True, False]


def test_power_and_energy_from_gpu_samples_and_counters():
    rows = []
    # device 0: 100 W then 300 W; counter 10 J -> 30 J. device 1: constant 200 W, no counter.
    for t, p0, e0 in [(0.0, 100.0, 10.0), (1.0, 300.0, 30.0), (5.0, 900.0, 99.0)]:
        rows.append(make_row(t, 0, 0, "gpu", power_w=p0, energy_j=e0, temp_gpu_c=50 + t))
        rows.append(make_row(t, 0, 1, "gpu", power_w=200.0, temp_gpu_c=40.0))
    tele = pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA)
    out = power_summary(tele, [(0.0, 1.0)])  # the 5 s sample lies outside
    assert out["power_w_mean"] == pytest.approx((200.0 + 200.0) / 2)
    assert out["power_w_peak"] == 300.0
    assert out["energy_j"] == pytest.approx(20.0) and out["energy_source"] == "hardware counter"
    assert out["temp_gpu_c_max"] == 51.0 and out["temp_gpu_c_spread"] == 11.0


def test_energy_integrated_from_host_power_when_no_counter():
    rows = [make_row(t, 0, None, "host", cpu_power_w=p)
            for t, p in [(0.0, 10.0), (1.0, 30.0), (3.0, 30.0)]]
    out = power_summary(pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA), [(0.0, 3.0)])
    assert out["energy_j"] == pytest.approx(20.0 + 60.0)  # trapezoids: 1 s x 20 W + 2 s x 30 W
    assert out["energy_source"] == "integrated cpu_power_w"


def test_summary_throughput_and_mfu_use_the_platform_peak():
    cfg = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", global_batch_size=8))
    t = steps([(0, r, "measured", 0.0, 2.0) for r in range(8)])
    summary, per_device, _, _ = summarize(
        cfg, t, TELEMETRY_SCHEMA.empty_table(), [2**30, 3 * 2**30], devices=[]
    )
    assert per_device == []
    from kit.analysis.flops import model_flops_per_step

    flops = model_flops_per_step(cfg.workload, 8)
    assert summary["step_time_s"] == 2.0
    assert summary["tokens_per_s"] == 8 * 2048 / 2.0
    assert summary["tflops_per_gpu"] == pytest.approx(flops / 2.0 / 8 / 1e12)
    assert summary["mfu"] == pytest.approx(summary["tflops_per_gpu"] / 989)
    assert summary["mem_peak_gib"] == 3.0 and summary["power_w_mean"] is None
