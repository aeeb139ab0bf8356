"""Energy over the measured steps from a counter read less often than the steps last (issue 33),
windows long enough for their figures, and the sampler's readings at the measured phase's edges.
"""

import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from kit.bundle.schema import STEPS_SCHEMA
from kit.bundle.telemetry_fields import TELEMETRY_SCHEMA, make_row
from kit.metrics.power import device_metrics
from kit.telemetry.edges import EDGE_ENV, poke_sampler

from .conftest import REPO, bundle_path, kit_cli, why_failed

H100_RUN = REPO / "tests/data/bundles/telemetry/20261125T122448Z-gpt3-1.3b-h100-f4a12c"
"""A recorded 1 x H100 gpt3-1.3b run (counter read every 120 ms, steps of 0.56 s)."""


def steps(windows: list[tuple[float, float]], phase: str = "measured") -> pa.Table:
    return pa.Table.from_pylist(
        [{"step": i, "rank": 0, "phase": phase, "t_start": a, "t_end": b, "tokens": 1,
          "loss": None, "stage": 0} for i, (a, b) in enumerate(windows)], schema=STEPS_SCHEMA)


def square_wave(t: np.ndarray, windows: list[tuple[float, float]]) -> np.ndarray:
    """700 W in the first half of each step, 300 W in its second half and between steps."""
    p = np.full(len(t), 300.0)
    for a, b in windows:
        p[(t >= a) & (t < (a + b) / 2)] = 700.0
    return p


def test_a_counter_slower_than_the_steps_gives_every_joule_of_the_windows():
    # Steps of 0.18 s with 1 ms gaps, power sampled every 5 ms, the counter read every 0.4 s
    # (the case of issue 33: most pairs of readings span non-adjacent step windows). The
    # counter is the exact integral of the sampled (piecewise linear) power, so the windows'
    # energy is known: the power integral over them.
    windows = [(1.0 + 0.181 * i, 1.0 + 0.181 * i + 0.18) for i in range(30)]
    t_fast = np.arange(0.0, 8.0, 0.005)
    power = square_wave(t_fast, windows)
    cum = np.r_[0.0, np.cumsum(np.diff(t_fast) * (power[1:] + power[:-1]) / 2)]
    t_slow = np.arange(0.013, 8.0, 0.4)
    rows = [make_row(float(t), 0, 0, "gpu", power_w=float(p)) for t, p in zip(t_fast, power,
                                                                           strict=True)]
    rows += [make_row(float(t), 0, 0, "gpu", energy_j=float(np.interp(t, t_fast, cum)))
             for t in t_slow]
    (d,), agg = device_metrics(pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA),
                               steps(windows), [], 1000)
    assert d["energy_source"] == "counter" and d["counter_coverage"] == 1.0
    assert d["energy_j"] == pytest.approx(d["power_integral_j"], rel=1e-3)
    # half of each 0.18 s step at 700 W, half at 300 W: 90 J a step
    assert d["energy_j"] == pytest.approx(30 * 90.0, rel=2e-3)
    assert abs(d["counter_vs_integral"]) < 1e-3 and agg["energy_check_max"] < 1e-3
    assert d["counter_readings"] == 16  # 14 inside the span, one on each side


def test_a_window_between_two_readings_gets_its_share_never_zero():
    # One measured step from 3.0 to 3.2 s; the counter read only at 0 and 10 s (1 kJ rise).
    rows = [make_row(0.0, 0, 0, "gpu", energy_j=5000.0), make_row(10.0, 0, 0, "gpu",
                                                                  energy_j=6000.0)]
    (d,), _ = device_metrics(pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA),
                             steps([(3.0, 3.2)]), [], 1)
    assert d["energy_j"] == pytest.approx(20.0) and d["energy_source"] == "counter"
    # With power samples, the rise is shared out by them: all of it falls in the busy step.
    rows += [make_row(t, 0, 0, "gpu", power_w=p)
             for t, p in [(0.0, 0.0), (2.99, 0.0), (3.0, 100.0), (3.2, 100.0), (3.21, 0.0),
                          (10.0, 0.0)]]
    (d,), _ = device_metrics(pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA),
                             steps([(3.0, 3.2)]), [], 1)
    assert d["energy_j"] == pytest.approx(1000.0 * 20.0 / (20.0 + 0.5 + 0.5))


def test_energy_that_cannot_be_known_is_none_never_zero():
    # The device is sampled inside the window (a temperature), but its counter starts after
    # the window and no power sample covers the window's start.
    rows = [make_row(1.5, 0, 0, "gpu", temp_gpu_c=50.0)]
    rows += [make_row(t, 0, 0, "gpu", energy_j=100.0 * t) for t in (5.0, 6.0)]
    (d,), agg = device_metrics(pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA),
                               steps([(1.0, 2.0)]), [], 1)
    assert d["energy_j"] is None and d["energy_source"] is None
    assert d["counter_coverage"] == 0.0 and agg["energy_j"] is None


def slowed_counter(telemetry: pa.Table, keep_every_s: float) -> pa.Table:
    """The same trace with the energy counter's readings thinned to one per ``keep_every_s``."""
    e = telemetry["energy_j"].to_numpy(zero_copy_only=False).astype(float)
    t = telemetry["t"].to_numpy()
    read = np.flatnonzero(~np.isnan(e))
    kept = read[np.r_[True, np.diff(np.floor(t[read] / keep_every_s)) > 0]]
    thinned = np.full(len(e), np.nan)
    thinned[kept] = e[kept]
    i = telemetry.schema.get_field_index("energy_j")
    return telemetry.set_column(i, "energy_j", pa.array(thinned, mask=np.isnan(thinned)))


def test_a_recorded_run_keeps_its_energy_when_its_counter_is_read_slower_than_its_steps():
    telemetry = pq.read_table(H100_RUN / "telemetry.parquet")
    st = pq.read_table(H100_RUN / "steps.parquet")
    facts = json.loads((H100_RUN / "manifest.json").read_text())["inventory"][0]["gpus"]
    tokens = 16 * 2048
    (full,), _ = device_metrics(telemetry, st, facts, tokens)
    (slow,), agg = device_metrics(slowed_counter(telemetry, 1.1), st, facts, tokens)
    step_s = float(np.median(pc.subtract(st["t_end"], st["t_start"]).to_numpy()))
    assert step_s < 1.1  # the counter is now slower than the steps
    assert slow["counter_readings"] < full["counter_readings"] / 5
    assert slow["energy_j"] == pytest.approx(full["energy_j"], rel=0.01)
    # the counter and the power samples, two sensors, agree within 5%
    assert abs(slow["counter_vs_integral"]) < 0.05 and abs(full["counter_vs_integral"]) < 0.05


def test_short_windows_and_unsteady_temperatures_are_marked():
    # 50 power samples and 3 counter readings over 1 s, the temperature still climbing.
    t = np.arange(0.0, 1.0, 0.02)
    rows = [make_row(float(x), 0, 0, "gpu", power_w=500.0, temp_gpu_c=40.0 + 30 * x)
            for x in t]
    rows += [make_row(x, 0, 0, "gpu", energy_j=500.0 * x) for x in (0.0, 0.5, 1.0)]
    (d,), agg = device_metrics(pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA),
                               steps([(0.0, 0.99)]), [], 1)
    assert (d["power_samples"], d["counter_readings"]) == (50, 3)
    assert d["window_short"] is True and agg["window_short"] is True
    assert d["temp_slope_c_per_min"] == pytest.approx(30 * 60, rel=0.01)
    assert d["temp_steady"] is False and agg["temp_steady"] is False
    # 10 s at 20 ms, counter every 0.5 s, a flat temperature: long enough and steady
    t = np.arange(0.0, 10.0, 0.02)
    rows = [make_row(float(x), 0, 0, "gpu", power_w=500.0, temp_gpu_c=60.0) for x in t]
    rows += [make_row(float(x), 0, 0, "gpu", energy_j=500.0 * x) for x in np.arange(0, 10, 0.5)]
    (d,), agg = device_metrics(pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA),
                               steps([(0.0, 9.9)]), [], 1)
    assert d["window_short"] is False and d["temp_steady"] is True
    assert agg["power_samples_min"] == d["power_samples"] >= 100


@pytest.mark.training
def test_a_short_measured_phase_extends_itself_and_says_so(tmp_path):
    # One measured step asked for, a minimum no CPU step reaches: the phase grows to its
    # bound (20 x the asked-for steps), every rank agreeing at each step's start.
    r = kit_cli("run", "gpt3-tiny", "--dp", "2", "--steps", "1", "--warmup", "0",
                "--min-measured-s", "3600", "--out", str(tmp_path))
    assert r.returncode == 0, why_failed(r)
    assert "measured phase extended" in r.stderr
    bundle = bundle_path(r.stdout)
    st = pq.read_table(bundle / "steps.parquet").to_pylist()
    assert sorted({s["step"] for s in st if s["phase"] == "measured"}) == list(range(20))
    assert {s["rank"] for s in st} == {0, 1}
    metrics = json.loads((bundle / "metrics.json").read_text())
    assert any("measured phase extended from 1 to 20 steps" in n for n in metrics["notes"])
    assert [p["measured_steps"] for p in metrics["per_rank"]] == [20, 20]


@pytest.mark.timeout(180)
def test_the_sampler_reads_the_counter_when_poked_and_as_it_stops(tmp_path, monkeypatch):
    """Pokes at the measured phase's edges make every lane read the energy counter at once,
    off its 500 ms schedule; stopping reads it a last time; the pipe goes with the sampler."""
    from kit.telemetry.sampler import TelemetrySampler
    from tests.fakes import fake_library
    from tests.test_telemetry_nvml import gpu_rows, h100, wait_for_reads

    with fake_library(monkeypatch, "pynvml", h100([7 * i for i in range(10**5)]), tmp_path):
        chunks = tmp_path / "chunks"
        sampler = TelemetrySampler([("nvml", {"node": 0})], interval_ms=20, chunks_dir=chunks,
                                   flush_s=0.1)
        sampler.start()
        try:
            monkeypatch.setenv(EDGE_ENV, str(sampler.edge_path))
            wait_for_reads(chunks, {0}, "energy_j", reads=1, timeout_s=60)
            t_first = time.time()
            for _ in range(20):  # 20 pokes over about 2 s: at most 5 reads on schedule
                poke_sampler()
                time.sleep(0.1)
            t_last = time.time()
            wait_for_reads(chunks, {0}, "pcie_tx_bytes", reads=30, timeout_s=60)
        finally:
            t_stop = time.time()
            report = sampler.stop()
        assert report.errors == []
        # its cost over the measured phase: from the first poke to the last, start-up left out
        assert report.measured_wall_s == pytest.approx(t_last - t_first, abs=0.5)
        assert report.measured_cpu_s is not None and 0 < report.measured_cpu_s < report.cpu_s
        assert 0 < report.measured_ticks < report.ticks and report.measured_missed_ticks >= 0
        energy = sorted(r["t"] for r in gpu_rows(chunks) if r["energy_j"] is not None)
        assert len([t for t in energy if t_first <= t <= t_last + 0.05]) >= 10
        assert energy[-1] >= t_stop  # the last reading follows the stop
        assert not sampler.edge_path.exists()
        poke_sampler()  # a poke after the sampler is gone is ignored
        assert os.environ[EDGE_ENV] == str(sampler.edge_path)


TRACE = REPO / "tests/data/traces/h200x4-gpt3-1.3b"
"""4 x H200, gpt3-1.3b DP4: the counter read every 500 ms, steps of 0.17 s (README there)."""


def pair_energy(t: np.ndarray, e: np.ndarray, start: np.ndarray, end: np.ndarray) -> float:
    """The rule this replaces: a counter rise counts only between two readings inside one step
    window, or split at the edge of two adjacent ones; every other pair is dropped."""
    which = np.searchsorted(start, t, side="right") - 1
    inside = (which >= 0) & (t <= end[np.clip(which, 0, None)])
    total = 0.0
    for i in range(len(t) - 1):
        w0, w1 = which[i], which[i + 1]
        if not (inside[i] and inside[i + 1]):
            continue
        if w0 == w1:
            total += e[i + 1] - e[i]
        elif w1 == w0 + 1:
            share = ((end[w0] - t[i]) + (t[i + 1] - start[w1])) / (t[i + 1] - t[i])
            total += (e[i + 1] - e[i]) * share
    return total


def test_a_recorded_four_gpu_trace_with_a_counter_slower_than_its_steps_adds_up():
    telemetry = pq.read_table(f"{TRACE}.parquet")
    st = pq.read_table(f"{TRACE}.steps.parquet")
    facts = json.loads(Path(f"{TRACE}.devices.json").read_text())
    recorded = json.loads(Path(f"{TRACE}.metrics.json").read_text())
    per_device, agg = device_metrics(telemetry, st, facts, recorded["tokens_per_step"], 0.9,
                                     recorded["zeus_measured_energy_j"])
    assert len(per_device) == 4
    measured = st.filter(pc.equal(st["phase"], "measured")).to_pandas()
    spans = measured.groupby("step").agg(a=("t_start", "min"), b=("t_end", "max"))
    start, end = spans["a"].to_numpy(), spans["b"].to_numpy()
    rows = telemetry.to_pandas()
    for d in per_device:
        counter = rows[(rows.source == "gpu") & (rows.device == d["device"])
                       & rows.energy_j.notna()].sort_values("t")
        t, e = counter["t"].to_numpy(), counter["energy_j"].to_numpy()
        inside = t[(t >= start[0]) & (t <= end[-1])]
        assert np.median(np.diff(inside)) > 2 * np.median(end - start)  # slower than the steps
        # every joule of the windows: the counter within 5% of the power integral, where the
        # pairs-only rule left most of it out
        assert abs(d["counter_vs_integral"]) < 0.05
        assert pair_energy(t, e, start, end) < 0.6 * d["energy_j"]
        assert d["counter_coverage"] == 1.0 and d["window_short"] is False
    # Zeus's windows around each rank's measured phase read the same counters: within 2%
    assert abs(agg["zeus_vs_counter"]) <= 0.02
    assert agg["energy_j"] == pytest.approx(recorded["recorded_power"]["energy_j"], rel=1e-9)


def test_zeus_around_the_phase_is_compared_over_the_same_span_gaps_included():
    # Two measured steps of 1 s at 600 W with a 3 s gap at 100 W between them (a profiled
    # step's trace export, untimed): the steps' energy is 1200 J, the phase's 1500 J. Zeus's
    # one window around the phase reads the latter; the cross-check compares like with like.
    t = np.arange(0.0, 7.0, 0.02)
    power = np.where(((t >= 1.0) & (t <= 2.0)) | ((t >= 5.0) & (t <= 6.0)), 600.0, 100.0)
    cum = np.r_[0.0, np.cumsum(np.diff(t) * (power[1:] + power[:-1]) / 2)]
    rows = [make_row(float(x), 0, 0, "gpu", power_w=float(p)) for x, p in zip(t, power,
                                                                           strict=True)]
    rows += [make_row(float(x), 0, 0, "gpu", energy_j=float(np.interp(x, t, cum)))
             for x in np.arange(0.01, 7.0, 0.5)]
    (d,), agg = device_metrics(pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA),
                               steps([(1.0, 2.0), (5.0, 6.0)]), [], 1, 0.9, [1500.0])
    assert d["energy_j"] == pytest.approx(1200.0, rel=0.01)
    assert d["span_energy_j"] == pytest.approx(1500.0, rel=0.01)
    assert abs(agg["zeus_vs_counter"]) < 0.01
