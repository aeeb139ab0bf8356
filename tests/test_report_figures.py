"""The report's per-run figures on the recorded H100/H200 bundles: what they show and on what
scale (kit.analysis.run_view, plots_run, plots_common)."""

import json

import numpy as np
import pytest
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgba

from kit.analysis import plots_run
from kit.analysis.plots_common import STATUS_COLOR, warmup_factor
from kit.analysis.run_view import Scales, run_view
from kit.bundle.reader import read_bundle

from .conftest import REPO
from .many_bundles import many_bundles

BUNDLES = sorted(p for p in (REPO / "tests/data/bundles").glob("*/2*") if p.is_dir())
H100 = next(b for b in BUNDLES if b.name.endswith("h100-f4a12c"))


@pytest.fixture(scope="module")
def views():
    return [run_view(read_bundle(b)) for b in BUNDLES]


def test_per_device_stats_over_the_measured_steps_are_those_of_metrics_json(views):
    for view in views:
        per_device = json.loads((view.bundle.path / "metrics.json").read_text())["per_device"]
        assert view.scope == "measured steps"
        for d in per_device:
            stats = view.stats[(d["node"], d["device"])]
            assert stats.power_mean == pytest.approx(d["power_w_mean"], rel=1e-9)
            assert stats.power_max == pytest.approx(d["power_w_peak"], rel=1e-9)
            assert stats.temp_max == pytest.approx(d["temp_gpu_c_max"], rel=1e-9)


def rows(views):
    return [plots_run.RunRow(n, f"run {n}", v) for n, v in enumerate(views, 1)]


def texts(ax):
    return [t for t in ax.texts if t.get_text()]


def band_ticks(ax):
    """The y tick labels drawn left of the axes (x < 0), top band first: (y, label)."""
    return sorted(((t.get_position()[1], t.get_text()) for t in ax.texts
                   if t.get_position()[0] < 0), reverse=True)


def test_runs_share_their_power_axis_and_draw_the_power_limit(views):
    scales = Scales.of(views)
    fig = plots_run.power_timelines(rows(views), scales)
    power, temp = fig.axes[:2]
    ticks = band_ticks(power)
    labels = [label for _, label in ticks]
    per_run = len(labels) // len(views)
    assert labels == labels[:per_run] * len(views)  # one scale for every run
    peak = max(json.loads((v.bundle.path / "metrics.json").read_text())["summary"]["power_w_peak"]
               for v in views)
    assert scales.power_top_w["board"] > peak >= float(labels[0])
    zeros = [y for y, label in ticks if label == "0"]
    limits = sorted((seg[0][1] for c in power.collections if isinstance(c, LineCollection)
                     and c.get_linestyle()[0][1] is not None for seg in c.get_segments()),
                    reverse=True)
    assert len(limits) == len(views) == len(zeros)  # a power limit per run, in its band
    assert len({round(lim - zero, 9) for lim, zero in zip(limits, zeros, strict=True)}) == 1
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {v.power_limits_w[0] for v in views} == {700.0}
    assert "power limit 700 W" in legend and "n0 SXM1" in legend
    titles = [t.get_text() for t in texts(power)]
    periods = [t.get_text() for t in texts(temp)]
    for n, view in enumerate(views, 1):
        assert f"{n}. run {n}" in titles  # every run has its band
        assert view.period_text() in periods


def test_the_measured_steps_fill_the_time_axis_and_warmup_stays_visible(views):
    view = next(v for v in views if v.bundle.path == H100)
    fig = plots_run.power_timelines(rows([view]), Scales.of([view]))
    ax = fig.axes[0]
    assert warmup_factor(view.axis) is not None and ax.get_xscale() == "function"
    to_axes = ax.transAxes.inverted().transform
    start = to_axes(ax.transData.transform((0.0, 0)))[0]  # time 0: the first measured step
    assert start == pytest.approx(0.2, abs=1e-6)  # warmup: a fifth of the axis
    warm = view.axis.measured[0] - view.axis.lo
    assert warm / (view.axis.hi - view.axis.lo) > 0.4  # it would have taken far more


def test_throttle_is_drawn_as_spans_over_the_samples(views):
    view = next(v for v in views if v.bundle.path == H100)
    times, share = plots_run.throttle_steps(view.throttle, 1)  # power_cap
    m0, m1 = view.axis.measured
    inside = (times >= m0) & (times < m1)
    summary = json.loads((H100 / "metrics.json").read_text())["power"]
    assert summary["throttle_frac_by_reason"]["power_cap"] == 1.0
    assert np.all(share[inside] == 1.0)  # a solid band, not sparse ticks
    fig = plots_run.clock_throttle_timelines(rows([view]), Scales.of([view]))
    spans = [c for c in fig.axes[1].collections
             if c.get_facecolor().tolist() == [list(to_rgba("#c0392b"))]]
    assert spans and len(spans[0].get_paths()) == 6  # a filled band per reason
    assert "100%" in [t.get_text() for t in fig.axes[1].texts]  # power_cap's share


def test_heatmaps_show_the_slots_present_on_one_scale(views):
    scales = Scales.of(views)
    fig = plots_run.chassis_heatmaps(rows(views), scales)
    temp, power = fig.axes[:2]
    for ax in (temp, power):  # a grid per run: 1 GPU of 8 slots each
        assert [im.get_array().shape for im in ax.get_images()] == [(1, 1)] * len(views)
    assert all(im.norm.vmin == scales.temp_mean_c[0] for im in temp.get_images())
    assert all(im.norm.vmax == scales.power_mean_w[1] for im in power.get_images())
    assert len(fig.axes) == 4  # one colour bar per quantity


def test_small_multiples_of_many_runs_mark_a_failed_one_off_their_scales(tmp_path):
    many = [run_view(read_bundle(b)) for b in many_bundles(tmp_path, 9)]
    failed = [n for n, v in enumerate(many, 1) if v.bundle.manifest.status != "ok"]
    assert failed == [8]
    scales = Scales.of(many)
    chunks = plots_run.chunks(rows(many))
    assert [len(c) for c in chunks] == [plots_run.ROWS_PER_FIGURE, 1]
    heatmaps = plots_run.chassis_heatmaps(chunks[0], scales)
    temp, power = heatmaps.axes[:2]
    assert len(power.get_images()) == 8 and len(temp.get_images()) == 8
    ok_power = [s.power_mean for v in many if v.bundle.manifest.status == "ok"
                for s in v.stats.values()]
    assert power.get_images()[0].norm.vmin == min(ok_power)  # the failed run's idle GPUs
    assert min(s.power_mean for s in many[7].stats.values()) < min(ok_power)  # do not stretch it
    assert sum("(off scale)" in t.get_text() for t in power.texts) == 4  # its 4 GPUs, said
    title = next(t for t in temp.texts if t.get_text().startswith("8. "))
    assert title.get_color() == STATUS_COLOR and "node 0" in title.get_text()
    for draw in (plots_run.power_timelines, plots_run.clock_throttle_timelines):
        fig = draw(chunks[0], scales)
        titles = [t for t in fig.axes[0].texts if t.get_text()[:2] in {f"{n}." for n in
                                                                        range(1, 9)}]
        assert [t.get_text()[:2] for t in titles] == [f"{n}." for n in range(1, 9)]
        assert "FAILED" in titles[7].get_text() and titles[7].get_color() == STATUS_COLOR
        assert len(fig.legends) == 1  # one legend for all runs
