"""Attribution and per-device power/thermal metrics against values worked out by hand."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from kit.bundle.schema import STEPS_SCHEMA, MetricsFile
from kit.bundle.telemetry_fields import TELEMETRY_SCHEMA, THROTTLE_BITS, make_row
from kit.metrics.attribution import attribute_samples
from kit.metrics.power import device_metrics
from kit.metrics.summary import summarize
from kit.plan.resolve import RunRequest, resolve


def steps(rows):
    """(step, rank, phase, t_start, t_end) tuples -> a steps table."""
    return pa.Table.from_pylist(
        [dict(zip(("step", "rank", "phase", "t_start", "t_end"), r, strict=True), tokens=1,
              loss=None, stage=0) for r in rows], schema=STEPS_SCHEMA)


def table(rows):
    return pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA)


def one(per_device, device):
    (d,) = [d for d in per_device if d["device"] == device]
    return d


def test_attribution_warmup_measured_idle_gaps_and_shared_bounds():
    st = steps([
        (0, 0, "warmup", 10.0, 11.0), (0, 1, "warmup", 10.1, 11.2),        # window [10, 11.2]
        (1, 0, "measured", 11.5, 12.5), (1, 1, "measured", 11.6, 12.4),    # window [11.5, 12.5]
        (2, 0, "measured", 12.5, 13.0),                                    # touches step 1
    ])
    # time -> (step, phase); rows deliberately out of time order, one host row
    expect = {
        13.5: (None, "idle"),        # after the last step
        9.0: (None, "idle"),         # before the first step
        10.0: (0, "warmup"),         # window start is inside
        11.2: (0, "warmup"),         # window end (latest rank's t_end) is inside
        11.3: (None, "idle"),        # gap between steps 0 and 1
        12.0: (1, "measured"),
        12.5: (2, "measured"),       # shared bound: the later-starting step
        13.0: (2, "measured"),
    }
    rows = [make_row(t, 0, 0, "gpu") for t in expect] + [make_row(12.0, 0, None, "host")]
    out = attribute_samples(table(rows), st)
    assert out.schema.field("step").type == pa.int32()
    assert out.schema.field("phase").type == pa.string()
    got = list(zip(out["step"].to_pylist(), out["phase"].to_pylist(), strict=True))
    assert got == [*expect.values(), (1, "measured")]
    assert out.select(TELEMETRY_SCHEMA.names).equals(table(rows))


def test_attribution_without_steps_is_all_idle():
    out = attribute_samples(table([make_row(1.0, 0, 0, "gpu")]), steps([]))
    assert out["step"].to_pylist() == [None] and out["phase"].to_pylist() == ["idle"]


def energy_rows():
    # Windows: warmup [-2, -1]; measured step 1 [0, 1] and step 2 [1.5, 2.5]; 1.25 is idle.
    # device 0 has the counter; device 1 only power.
    times = [-1.5, 0.0, 0.5, 1.0, 1.25, 1.5, 2.0, 2.5]
    counter = [0.0, 100.0, 150.0, 200.0, 230.0, 260.0, 310.0, 360.0]
    power = [5000.0, 100.0, 200.0, 100.0, 999.0, 300.0, 300.0, 100.0]
    return ([make_row(t, 0, 0, "gpu", energy_j=e, power_w=100.0)
             for t, e in zip(times, counter, strict=True)]
            + [make_row(t, 0, 1, "gpu", power_w=p) for t, p in zip(times, power, strict=True)])


ENERGY_STEPS = [(0, 0, "warmup", -2.0, -1.0), (1, 0, "measured", 0.0, 1.0),
                (2, 0, "measured", 1.5, 2.5)]


@pytest.mark.parametrize("order", ["time", "reversed"])
def test_energy_from_counter_and_from_integrated_power(order):
    rows = energy_rows()
    per_device, agg = device_metrics(
        table(rows if order == "time" else rows[::-1]), steps(ENERGY_STEPS), [],
        tokens_per_step=50)
    d0, d1 = one(per_device, 0), one(per_device, 1)
    # device 0, counter: (200 - 100) + (360 - 260) = 200 J; the idle 1.25 s sample
    # (counter 230) and the warmup sample do not count.
    assert d0["energy_j"] == 200.0 and d0["energy_source"] == "counter"
    assert d0["energy_j_per_step"] == 100.0 and d0["samples"] == 6
    # device 1, trapezoids per window: [0, 1]: .5 x (100 + 200) / 2 + .5 x (200 + 100) / 2
    # = 150 J; [1.5, 2.5]: .5 x (300 + 300) / 2 + .5 x (300 + 100) / 2 = 250 J; total 400 J
    # (integrating across the gap through the 999 W idle sample would add more).
    assert d1["energy_j"] == pytest.approx(400.0) and d1["energy_source"] == "integrated power"
    # job: 600 J over 2 measured steps x 50 tokens
    assert agg["energy_j"] == pytest.approx(600.0) and agg["energy_source"] == "mixed"
    assert agg["energy_j_per_step"] == pytest.approx(300.0)
    assert agg["energy_j_per_token"] == pytest.approx(600.0 / 100)


def test_energy_is_unknown_for_the_job_when_one_device_has_none():
    rows = [make_row(t, 0, 0, "gpu", energy_j=10.0 * t) for t in (0.0, 1.0)]
    rows += [make_row(t, 0, 1, "gpu", temp_gpu_c=50.0) for t in (0.0, 1.0)]
    per_device, agg = device_metrics(table(rows), steps([(0, 0, "measured", 0.0, 1.0)]), [], 1)
    assert one(per_device, 0)["energy_j"] == 10.0 and one(per_device, 1)["energy_j"] is None
    assert agg["energy_j"] is None and agg["energy_j_per_token"] is None


def test_excursions_peak_to_mean_and_runs_across_step_gaps():
    facts = [{"node": 0, "device": 0, "power_limit_w": 400.0},
             {"node": 0, "device": 1, "power_limit_w": 400.0},
             {"node": 0, "device": 2, "power_limit_w": None}]
    # Threshold 0.9 x 400 = 360 W, strictly above. Device 0, one window [0, 2]:
    #   t  0    .25  .5   .75  1.0  1.25 1.5  1.75 2.0  | 2.25 (idle)
    #   p  300  370  380  300  360  400  365  390  395  | 100
    #   run 1: .25-.5, back below at .75: 0.5 s; 360 W at 1.0 is not above;
    #   run 2: 1.25-2.0, no measured sample after: to its last sample, 0.75 s.
    power0 = [300, 370, 380, 300, 360, 400, 365, 390, 395, 100]
    rows = [make_row(0.25 * i, 0, 0, "gpu", power_w=float(p)) for i, p in enumerate(power0)]
    # Device 1 in two windows [0, 1] and [1.1, 2] (step gap idle sample at 1.05):
    #   t 0.5 (400), 1.0 (400), 1.05 idle (100), 1.5 (400), 2.0 (100): one run 0.5 -> 2.0 = 1.5 s
    rows += [make_row(t, 0, 1, "gpu", power_w=p)
             for t, p in [(0.5, 400.0), (1.0, 400.0), (1.05, 100.0), (1.5, 400.0), (2.0, 100.0)]]
    # Device 2 has no known limit: no excursion figures.
    rows += [make_row(t, 0, 2, "gpu", power_w=500.0) for t in (0.5, 1.5)]
    st_one = steps([(0, 0, "measured", 0.0, 2.0)])
    per_device, agg = device_metrics(table(rows[:10] + rows[15:]), st_one, facts, 1)
    d0 = one(per_device, 0)
    assert (d0["excursions"], d0["excursion_s"]) == (2, pytest.approx(0.5 + 0.75))
    # mean over the 9 measured samples: 3260 / 9; peak 400
    assert d0["power_w_mean"] == pytest.approx(3260 / 9) and d0["power_w_peak"] == 400.0
    assert d0["peak_to_mean"] == pytest.approx(400 / (3260 / 9))
    assert d0["power_limit_w"] == 400.0
    d2 = one(per_device, 2)
    assert d2["excursions"] is None and d2["excursion_s"] is None and d2["peak_to_mean"] == 1.0
    assert (agg["excursions"], agg["excursion_s"]) == (2, pytest.approx(1.25))
    assert agg["peak_to_mean"] == pytest.approx(400 / (3260 / 9))  # the worst device's

    st_two = steps([(0, 0, "measured", 0.0, 1.0), (1, 0, "measured", 1.1, 2.0)])
    per_device, agg = device_metrics(table(rows[10:15]), st_two, facts, 1)
    d1 = one(per_device, 1)
    assert (d1["excursions"], d1["excursion_s"]) == (1, pytest.approx(1.5))
    # excursion_frac moves the threshold: 1.0 x 400 W, and 400 W is not above it
    per_device, _ = device_metrics(table(rows[10:15]), st_two, facts, 1, excursion_frac=1.0)
    assert one(per_device, 1)["excursions"] == 0


def test_instantaneous_power_where_present_and_slow_rows_between():
    """Peak-to-mean and excursions use instantaneous power (``power_w``) where a device has it,
    else its averaged power, and say which; a slow counter's own rows (power null) between the
    fast ones neither split an excursion nor count as power samples."""
    facts = [{"node": 0, "device": d, "power_limit_w": 400.0} for d in (0, 1)]
    # Device 0 has both: instant 300, 380, 390, 300 W; the average a flat 340 W. Between its
    # fast rows, slow rows carry only the energy counter (the sampler's slow lane).
    rows = [make_row(0.5 * i, 0, 0, "gpu", power_w=p, power_avg_w=340.0)
            for i, p in enumerate([300.0, 380.0, 390.0, 300.0])]
    rows += [make_row(0.5 * i + 0.25, 0, 0, "gpu", energy_j=1000.0 + 170.0 * i) for i in range(3)]
    # Device 1 (an MI250 GCD) reports only the average.
    rows += [make_row(0.5 * i, 0, 1, "gpu", power_avg_w=p)
             for i, p in enumerate([200.0, 380.0, 200.0, 200.0])]
    per_device, agg = device_metrics(table(rows), steps([(0, 0, "measured", 0.0, 1.5)]), facts, 1)
    d0, d1 = one(per_device, 0), one(per_device, 1)
    assert d0["power_field"] == "power_w" and d1["power_field"] == "power_avg_w"
    # one run above 360 W from 0.5 s, back below at 1.5 s, across the slow rows at .75 and 1.25
    assert (d0["excursions"], d0["excursion_s"]) == (1, 1.0)
    assert d0["peak_to_mean"] == pytest.approx(390.0 / 342.5)
    assert (d1["excursions"], d1["excursion_s"]) == (1, 0.5)
    # The counter rose 340 J between its readings at 0.25 and 1.25 s; the window [0, 1.5]
    # reaches a quarter second past each, carried by the power integral at the counter's
    # scale. The integral runs linearly inside each sample interval (at the interval's mean
    # power: 340, 385 and 345 W over [0, .5], [.5, 1], [1, 1.5]): 363.75 J from .25 to 1.25 s,
    # 85 J and 86.25 J at the edges.
    assert d0["energy_j"] == pytest.approx(340.0 * (1 + (85.0 + 86.25) / 363.75))
    assert d0["energy_source"] == "counter" and d0["counter_coverage"] == pytest.approx(1 / 1.5)
    assert agg["power_field"] == "mixed" and agg["peak_to_mean"] == pytest.approx(380.0 / 245.0)


def test_throttle_fractions_by_reason_with_combined_bits():
    bits = THROTTLE_BITS
    # device 0: 0, power_cap, power_cap|thermal_hw, thermal_sw|other, null -> 4 readings
    t0 = [0, bits["power_cap"], bits["power_cap"] | bits["thermal_hw"],
          bits["thermal_sw"] | bits["other"], None]
    # device 1: power_brake, 0 -> 2 readings
    t1 = [bits["power_brake"], 0]
    rows = [make_row(0.1 * i, 0, 0, "gpu", throttle=v) for i, v in enumerate(t0)]
    rows += [make_row(0.1 * i, 0, 1, "gpu", throttle=v) for i, v in enumerate(t1)]
    per_device, agg = device_metrics(table(rows), steps([(0, 0, "measured", 0.0, 1.0)]), [], 1)
    d0, d1 = one(per_device, 0), one(per_device, 1)
    assert d0["throttle_frac"] == 3 / 4
    assert d0["throttle_frac_by_reason"] == {
        "power_cap": 2 / 4, "thermal_sw": 1 / 4, "thermal_hw": 1 / 4, "hw_slowdown": 0.0,
        "power_brake": 0.0, "other": 1 / 4}  # sums to 1.25 > 0.75: bits combine
    assert d1["throttle_frac"] == 1 / 2 and d1["throttle_frac_by_reason"]["power_brake"] == 1 / 2
    # job: pooled over the 6 readings: 3 + 1 throttled
    assert agg["throttle_frac"] == pytest.approx(4 / 6)
    assert agg["throttle_frac_by_reason"]["power_cap"] == pytest.approx(2 / 6)
    assert agg["throttle_frac_by_reason"]["power_brake"] == pytest.approx(1 / 6)
    assert agg["throttle_frac_by_reason"]["hw_slowdown"] == 0.0


def test_temperature_spread_clock_fraction_and_utilization():
    facts = [{"node": 0, "device": 0, "clock_sm_max_mhz": 2000.0},
             {"node": 0, "device": 1, "clock_sm_max_mhz": 1250.0},
             {"node": 1, "device": 0}]
    rows = [make_row(0.0, 0, 0, "gpu", temp_gpu_c=60.0, temp_mem_c=70.0, clock_sm_mhz=1800.0,
                     util_gpu_pct=100.0),
            make_row(1.0, 0, 0, "gpu", temp_gpu_c=70.0, temp_mem_c=75.0, clock_sm_mhz=1600.0,
                     util_gpu_pct=80.0),
            make_row(0.0, 0, 1, "gpu", temp_gpu_c=50.0, clock_sm_mhz=1000.0, util_gpu_pct=50.0),
            make_row(1.0, 0, 1, "gpu", temp_gpu_c=54.0, clock_sm_mhz=1000.0, util_gpu_pct=50.0),
            make_row(0.5, 1, 0, "gpu", temp_gpu_c=58.0, clock_sm_mhz=900.0)]
    per_device, agg = device_metrics(table(rows), steps([(0, 0, "measured", 0.0, 1.0)]), facts,
                                     1)
    assert [(d["node"], d["device"]) for d in per_device] == [(0, 0), (0, 1), (1, 0)]
    d00, d01, d10 = per_device
    # means 65, 52, 58; maxima 70, 54, 58
    assert (d00["temp_gpu_c_mean"], d00["temp_gpu_c_max"], d00["temp_mem_c_max"]) == (
        65.0, 70.0, 75.0)
    assert d01["temp_gpu_c_mean"] == 52.0 and d01["temp_mem_c_max"] is None
    # clock: 1700 / 2000 = 0.85; 1000 / 1250 = 0.8; node 1 has no max clock
    assert d00["clock_sm_frac_of_max"] == pytest.approx(0.85)
    assert d01["clock_sm_frac_of_max"] == pytest.approx(0.8)
    assert d10["clock_sm_frac_of_max"] is None and d10["util_gpu_pct_mean"] is None
    assert agg["temp_gpu_c_max"] == 70.0
    assert agg["temp_gpu_c_spread"] == 65.0 - 52.0  # per-device means, not samples (70 - 50)
    assert agg["temp_mem_c_max"] == 75.0
    assert agg["clock_sm_frac_of_max"] == pytest.approx((0.85 + 0.8) / 2)
    assert agg["util_gpu_pct_mean"] == pytest.approx((90.0 + 50.0) / 2)


def test_unmeasurable_figures_are_none_never_zero():
    st = steps([(0, 0, "measured", 0.0, 1.0)])
    (d,), agg = device_metrics(table([make_row(t, 0, 0, "gpu") for t in (0.0, 0.5, 1.0)]), st,
                               [{"node": 0, "device": 0, "power_limit_w": 700.0}], 10)
    assert d["samples"] == 3
    # what the figures rest on is known (none of it), the figures themselves are not
    counts = {"power_samples": 0, "counter_readings": 0, "window_s": 1.0}
    assert {k: d[k] for k in counts} == counts
    assert all(v is None for k, v in d.items() if k not in ("node", "device", "samples",
                                                            "power_limit_w", *counts))
    counts = {"power_samples_min": 0, "counter_readings_min": 0, "window_s": 1.0,
              "energy_steps": 1}
    assert {k: agg[k] for k in counts} == counts
    assert all(v is None for k, v in agg.items() if k not in ("excursion_frac", *counts))
    agg = {**agg, **dict.fromkeys(counts)}
    # no GPU rows, no telemetry, or no measured step: no devices and an all-None aggregate
    host_only = table([make_row(0.5, 0, None, "host", cpu_util_pct=5.0)])
    warmup_only = steps([(0, 0, "warmup", 0.0, 1.0)])
    gpu = table([make_row(0.5, 0, 0, "gpu", power_w=100.0)])
    for tele, s in [(host_only, st), (TELEMETRY_SCHEMA.empty_table(), st), (gpu, warmup_only),
                    (gpu, steps([]))]:
        assert device_metrics(tele, s, [], 10) == ([], agg)


def test_summarize_takes_power_and_thermal_figures_from_the_devices():
    cfg = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", global_batch_size=8))
    rows = energy_rows()
    rows += [make_row(t, 0, 0, "gpu", temp_gpu_c=50.0, throttle=1) for t in (0.25, 1.75)]
    facts = [{"node": 0, "device": d, "power_limit_w": 250.0, "clock_sm_max_mhz": 1980.0}
             for d in (0, 1)]
    summary, per_device, power, notes = summarize(cfg, steps(ENERGY_STEPS), table(rows),
                                                  [None], facts, excursion_frac=0.9)
    # energy 600 J (see above) over 2 measured steps x 8 x 2048 tokens
    assert summary["energy_j_per_token"] == pytest.approx(600 / (2 * 8 * 2048))
    assert summary["power_w_peak"] == 300.0 and summary["temp_gpu_c_max"] == 50.0
    assert summary["temp_gpu_c_spread"] == 0.0  # one device with temperatures
    assert summary["throttle_frac"] == 1.0 and summary["clock_sm_frac_of_max"] is None
    assert power["excursions"] == 1 and power["excursion_frac"] == 0.9  # device 1 > 225 W
    assert power["energy_source"] == "mixed" and "energy: mixed" in notes
    # what the bundle stores validates (no NaN) and round-trips through JSON
    metrics = MetricsFile(summary=summary, per_device=per_device, power=power, notes=notes)
    assert MetricsFile.model_validate_json(metrics.model_dump_json()) == metrics


def synthetic(samples: int, devices: int, period: float = 0.02, step_s: float = 0.64):
    """A 10-hour-like run: devices sampled together every ``period``, steps back to back.

    Per step of 32 samples: 22 at 660 W, then 10 at 420 W, with a 760 W spike at sample 5;
    power_cap set above 650 W, thermal_sw on sample 7.
    """
    n = samples * devices
    j = np.arange(samples) % 32  # sample index within its step
    power = np.where(j < 22, 660.0, 420.0)
    power[j == 5] = 760.0
    throttle = (power > 650).astype(np.int64) | np.where(j == 7, 2, 0)

    def each_device(per_sample):  # every device reads the same per round
        return np.repeat(per_sample, devices)

    cols = {"t": each_device(1.7e9 + np.arange(samples) * period),
            "node": np.zeros(n, np.int32), "device": np.tile(np.arange(devices, dtype=np.int32),
                                                             samples),
            "source": pa.array(["gpu"]).take(pa.array(np.zeros(n, np.int8))),
            "power_w": each_device(power), "energy_j": each_device(np.cumsum(power) * period),
            "temp_gpu_c": np.tile(55.0 + np.arange(devices), samples),
            "clock_sm_mhz": each_device(1980.0 - 100.0 * (throttle & 1)),
            "throttle": each_device(throttle)}
    nulls = {t: pa.nulls(n, t) for t in {f.type for f in TELEMETRY_SCHEMA}}  # one per type
    tele = pa.Table.from_arrays(
        [pa.array(cols[f.name], type=f.type) if f.name in cols else nulls[f.type]
         for f in TELEMETRY_SCHEMA], schema=TELEMETRY_SCHEMA)
    count, ranks = int(samples * period / step_s) - 1, devices
    start = np.repeat(1.7e9 + 0.001 + np.arange(count) * step_s, ranks)
    st = pa.Table.from_pydict({
        "step": np.repeat(np.arange(count, dtype=np.int32), ranks),
        "rank": np.tile(np.arange(ranks, dtype=np.int32), count),
        "phase": pa.array(["warmup", "measured"]).take(pa.array(
            (np.repeat(np.arange(count), ranks) >= 3).astype(np.int8))),
        "t_start": start, "t_end": start + step_s - 0.005,
        "tokens": np.ones(count * ranks, np.int64), "loss": pa.nulls(count * ranks, pa.float64()),
        "stage": np.zeros(count * ranks, np.int32),
        "gpu_energy_j": pa.nulls(count * ranks, pa.float64())}, schema=STEPS_SCHEMA)
    return tele, st


SAMPLES = 200_000
"""1.1 hours at 20 ms on 8 devices (1.6M rows, ~6k steps): exact figures over many steps. How
fast 10 hours go is benchmarks/perf/power_metrics_10h.py's to say."""


def test_a_long_run_s_attribution_and_device_metrics_are_exact():
    tele, st = synthetic(SAMPLES, 8)
    facts = [{"node": 0, "device": d, "power_limit_w": 800.0, "clock_sm_max_mhz": 1980.0}
             for d in range(8)]
    attributed = attribute_samples(tele, st)
    per_device, agg = device_metrics(tele, st, facts, tokens_per_step=1)
    # Step k's window [k x .64 + .001, (k + 1) x .64 - .004] holds samples 1..31 of its 32
    # (sample 0, at k x .64, lies just before it); steps 0-2 are warmup.
    measured = int(SAMPLES * 0.02 / 0.64) - 1 - 3
    assert pc.sum(pc.equal(attributed["phase"], "measured")).as_py() == 8 * 31 * measured
    assert len(per_device) == 8
    d = per_device[0]
    assert d["samples"] == 31 * measured
    # the counter adds each sample's power x 20 ms: from sample 1 to 31 it adds samples 2..31;
    # from a step's sample 31 (.016 s before its window ends) to the next step's sample 1
    # (.019 s after that window starts) it adds 2 x 660 W x 20 ms, of which .035 / .04 counts.
    per_step = 0.02 * sum(760.0 if j == 5 else 660.0 if j < 22 else 420.0 for j in range(2, 32))
    across = 0.035 / 0.04 * 2 * 660.0 * 0.02
    assert d["energy_j_per_step"] == pytest.approx(per_step + across * (measured - 1) / measured,
                                                   rel=1e-5)
    # one 760 W sample per step above 0.9 x 800 W, back below 20 ms later
    assert d["excursions"] == measured and d["excursion_s"] == pytest.approx(0.02 * measured)
    assert agg["excursions"] == 8 * measured and d["power_w_peak"] == 760.0
    assert agg["throttle_frac_by_reason"]["thermal_sw"] == pytest.approx(1 / 31)
