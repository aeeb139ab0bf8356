"""Summary metrics against values computed by hand."""

import pyarrow as pa
import pytest

from kit.bundle.schema import STEPS_SCHEMA
from kit.bundle.telemetry_fields import TELEMETRY_SCHEMA, make_row
from kit.metrics.power import host_power
from kit.metrics.summary import step_spans, summarize
from kit.plan.resolve import RunRequest, resolve


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


def test_summary_power_from_gpu_samples_and_counters():
    cfg = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", global_batch_size=8))
    rows = []
    # device 0: 100 W then 300 W; counter 10 J -> 30 J. device 1: constant 200 W, no counter.
    for t, p0, e0 in [(0.0, 100.0, 10.0), (1.0, 300.0, 30.0), (5.0, 900.0, 99.0)]:
        rows.append(make_row(t, 0, 0, "gpu", power_w=p0, energy_j=e0, temp_gpu_c=50 + t))
        rows.append(make_row(t, 0, 1, "gpu", power_w=200.0, temp_gpu_c=40.0))
    tele = pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA)
    st = steps([(0, 0, "measured", 0.0, 1.0)])  # the 5 s samples lie outside
    summary, per_device, power, notes = summarize(cfg, st, tele, [None], devices=[])
    assert [(d["node"], d["device"]) for d in per_device] == [(0, 0), (0, 1)]
    assert summary["power_w_mean"] == pytest.approx((200.0 + 200.0) / 2)
    assert summary["power_w_peak"] == 300.0
    # device 0 counter: 30 - 10 = 20 J; device 1 integrated: 1 s x 200 W = 200 J
    assert power["energy_j"] == pytest.approx(220.0) and power["energy_source"] == "mixed"
    assert summary["energy_j_per_token"] == pytest.approx(220.0 / (8 * 2048))
    # hottest sample 51; per-device means 50.5 and 40
    assert summary["temp_gpu_c_max"] == 51.0 and summary["temp_gpu_c_spread"] == 10.5
    assert "energy: mixed" in notes


def test_energy_integrated_from_host_power_when_no_counter():
    rows = [make_row(t, 0, None, "host", cpu_power_w=p)
            for t, p in [(0.0, 10.0), (1.0, 30.0), (3.0, 30.0)]]
    tele = pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA)
    out = host_power(tele, steps([(0, 0, "measured", 0.0, 3.0)]), tokens_per_step=10)
    assert out["energy_j"] == pytest.approx(20.0 + 60.0)  # trapezoids: 1 s x 20 W + 2 s x 30 W
    assert out["energy_source"] == "integrated cpu_power_w"
    assert out["energy_j_per_token"] == pytest.approx(80.0 / 10)
    assert out["power_w_mean"] == pytest.approx(70 / 3) and out["power_w_peak"] == 30.0


def test_summary_throughput_and_mfu_use_the_platform_peak():
    cfg = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", global_batch_size=8))
    t = steps([(0, r, "measured", 0.0, 2.0) for r in range(8)])
    summary, per_device, _, _ = summarize(
        cfg, t, TELEMETRY_SCHEMA.empty_table(), [2**30, 3 * 2**30], devices=[]
    )
    assert per_device == []
    from kit.metrics.flops import model_flops_per_step

    flops = model_flops_per_step(cfg.workload, 8)
    assert summary["step_time_s"] == 2.0
    assert summary["tokens_per_s"] == 8 * 2048 / 2.0
    assert summary["tflops_per_gpu"] == pytest.approx(flops / 2.0 / 8 / 1e12)
    assert summary["mfu"] == pytest.approx(summary["tflops_per_gpu"] / 989)
    assert summary["mem_peak_gib"] == 3.0 and summary["power_w_mean"] is None
