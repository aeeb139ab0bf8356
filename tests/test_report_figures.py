"""The report's per-run figures on the recorded H100/H200 bundles: what they show and on what
scale (kit.analysis.run_view, plots_run, plots_common)."""

import json

import numpy as np
import pytest

from kit.analysis import plots_run
from kit.analysis.plots_common import warmup_factor
from kit.analysis.run_view import Scales, run_view
from kit.bundle.reader import read_bundle

from .conftest import REPO

BUNDLES = sorted(p for p in (REPO / "benchmarks").glob("*/bundles/*") if p.is_dir())
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


def test_runs_share_their_power_axis_and_draw_the_power_limit(views):
    scales = Scales.of(views)
    figures = [plots_run.power_timeline(v, scales) for v in views]
    tops = {fig.axes[0].get_ylim() for fig in figures}
    assert len(tops) == 1  # one scale for every run
    peak = max(json.loads((v.bundle.path / "metrics.json").read_text())["summary"]["power_w_peak"]
               for v in views)
    assert tops.pop()[1] > peak
    for fig, view in zip(figures, views, strict=True):
        limits = [line.get_ydata()[0] for line in fig.axes[0].get_lines()
                  if line.get_linestyle() == "--"]
        assert limits == view.power_limits_w == [700.0]
        assert view.period_text() in fig.get_suptitle()


def test_the_measured_steps_fill_the_time_axis_and_warmup_stays_visible(views):
    view = next(v for v in views if v.bundle.path == H100)
    fig = plots_run.power_timeline(view, Scales.of([view]))
    ax = fig.axes[0]
    m0 = view.axis.measured[0]
    assert warmup_factor(view.axis) is not None and ax.get_xscale() == "function"
    to_axes = ax.transAxes.inverted().transform
    start = to_axes(ax.transData.transform((m0, 0)))[0]
    assert start == pytest.approx(0.2, abs=1e-6)  # warmup: a fifth of the axis
    warm = m0 - view.axis.lo
    assert warm / (view.axis.hi - view.axis.lo) > 0.4  # it would have taken far more


def test_throttle_is_drawn_as_spans_over_the_samples(views):
    view = next(v for v in views if v.bundle.path == H100)
    times, share = plots_run.throttle_steps(view.throttle, 1)  # power_cap
    m0, m1 = view.axis.measured
    inside = (times >= m0) & (times < m1)
    summary = json.loads((H100 / "metrics.json").read_text())["power"]
    assert summary["throttle_frac_by_reason"]["power_cap"] == 1.0
    assert np.all(share[inside] == 1.0)  # a solid band, not sparse ticks
    fig = plots_run.clock_and_throttle(view, Scales.of([view]))
    assert fig.axes[1].collections  # filled spans


def test_heatmaps_show_the_slots_present_on_one_scale(views):
    scales = Scales.of(views)
    for view in views:
        fig = plots_run.chassis_heatmaps(view, scales)
        images = [im for ax in fig.axes for im in ax.get_images()]
        assert [im.get_array().shape for im in images] == [(1, 1), (1, 1)]  # 1 GPU of 8 slots
        assert images[0].norm.vmin == scales.temp_mean_c[0]
        assert images[1].norm.vmax == scales.power_mean_w[1]
