"""Assemble a report on bundles: the comparison, its checks and every figure, as one file.

Figures are PNG files in a folder beside the report (``<name>_figures/``), linked relatively,
so a report of 100 bundles stays a small page that a browser renders quickly; HTML with
``single_file`` embeds them as base64 ``data:`` URIs instead, so the file can be mailed as is.
Each figure is drawn once, the figures of all bundles in parallel on the host's cores
(:mod:`kit.analysis.figure_render`). Both formats open with a table of contents, then the
sections a caller puts first (the study's Findings: :class:`LeadSection`), then the ranking of
configurations (:mod:`kit.analysis.ranking`). The HTML is readable on a narrow screen (a
viewport tag; tables scroll sideways in their own box).

Figures across configurations come first (:mod:`kit.analysis.plots_cross`, the study's
:mod:`kit.analysis.plots_study`), then one section
per bundle, named by its configuration. The runs' timelines and chassis heatmaps are small
multiples (:mod:`kit.analysis.plots_run`): a figure per kind for every
:data:`~kit.analysis.plots_run.ROWS_PER_FIGURE` runs, a row per run, shown before the first of
their sections; each run's section points at its rows (:class:`RunPanel`, anchored where its own
figures used to be). Each figure has a stable id and a caption; a figure a bundle cannot have
is replaced by a note saying why, from what the bundle holds (no samples, the sampler off, a
field's recorded reason, no chassis layout, no profile); the figures across configurations that
no bundle can fill are left out, named in one line with why. A caller may name the report and
say something first, under the heading (:class:`Opening`: the study says what was measured on
what). Every bundle's telemetry is drawn
whatever its status: a failed run's samples up to the crash are kept, and its rows say how it
ended.

Every bundle is verified before it is used. One that failed and is reported only because of
``--allow-unverified`` is named in a warning under the title, flagged in the comparison and
its checks, and its own section says what failed.
"""

import base64
import html
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.compute as pc
from matplotlib.figure import Figure

import kit
from kit.analysis import plots_cross, plots_experts, plots_run, plots_study
from kit.analysis.compare import Comparison, Group, compare_bundles
from kit.analysis.compare_format import check_lines, metric_grids, table_notes
from kit.analysis.figure_render import map_forked, render_all
from kit.analysis.ranking import (
    ENERGY_CHECK_LIMIT,
    energy_check,
    instantaneous,
    power_samples,
    ranking_html,
    ranking_notes,
    ranking_text,
    window_s,
    window_short,
)
from kit.analysis.run_view import RunView, Scales, run_view
from kit.analysis.side_by_side import fabric_curves
from kit.bundle.reader import Bundle
from kit.metrics.kernels import kernel_times
from kit.metrics.labels import chassis_assumed, layout_label, shared_phrase
from kit.metrics.stragglers import straggler_line
from kit.neutralize import markdown_safe, safe_table
from kit.projection.file import projection_facts, projection_of


@dataclass(frozen=True)
class FigureItem:
    """One figure of the report, or the note that stands in for it."""

    id: str
    title: str
    """A few words for the table of contents."""
    caption: str
    png: bytes | None
    note: str = ""
    """Why there is no figure (when ``png`` is None)."""


@dataclass(frozen=True)
class RunPanel:
    """Where a run's part of a figure of several runs is: the figure and its rows, or why the
    run has none."""

    id: str
    """The anchor in the run's section (``power-timeline-3``)."""
    title: str
    figure: str | None
    """The id of the figure holding the run's rows; None when the run has nothing to draw."""
    where: str
    """Which rows are the run's (``row 3 of 8``), or why there are none."""
    remark: str = ""
    """What else to know when reading them (a short window, assumed positions)."""


@dataclass(frozen=True)
class Section:
    """One bundle's part of the report."""

    id: str
    title: str
    """The bundle's configuration (its group's short label), how it ended."""
    bundle: Bundle
    facts: list[tuple[str, str]]
    figures: list[FigureItem]
    """Figures (:class:`FigureJob` until drawn)."""
    panels: list[RunPanel] = field(default_factory=list)
    """Its rows in the figures of several runs."""
    shared: list[FigureItem] = field(default_factory=list)
    """Figures of several runs shown before this section (the first of their runs)."""
    shared_id: str = ""
    shared_title: str = ""
    """The anchor and heading of ``shared`` (``Runs 1-8: timelines and chassis heatmaps``)."""


@dataclass(frozen=True)
class FigureJob:
    """A figure still to draw: ``draw`` builds it, or returns None (then ``note`` says why)."""

    id: str
    title: str
    caption: str
    draw: Callable[[], Figure | None]
    note: str


@dataclass(frozen=True)
class LeadSection:
    """A section a caller puts first in the report, before the ranking (the study's Findings).

    Its body is given already rendered for each format; its figures are written and linked
    (or inlined) like the report's own, after the body.
    """

    id: str
    title: str
    html: str
    """The section's body as HTML (escaped by the caller)."""
    markdown: str
    figures: list[FigureItem] = field(default_factory=list)


def _field_reason(bundle: Bundle, name: str) -> str:
    """Why a telemetry field has no samples: its recorded reason, or that none came."""
    source = bundle.manifest.telemetry_sources.get(name)
    if source is None:
        return f"{name}: not recorded"
    if source.source is None:
        return f"{name}: {source.reason or 'no source'}"
    return f"{name}: {source.source} recorded no samples"


def _no_samples_reason(bundle: Bundle, fields: tuple[str, ...]) -> str:
    """Why a time-series figure is missing: no telemetry at all, or these fields' reasons."""
    if bundle.telemetry.num_rows == 0:
        interval = bundle.manifest.config.get("telemetry_interval_ms")
        why = (f"the sampler was off ({_sampler_off_by(bundle.manifest.command)})"
               if interval == 0 else "the sampler recorded none")
        return f"no telemetry samples in this bundle: {why}"
    return "no samples of " + "; ".join(_field_reason(bundle, f) for f in fields)


def _sampler_off_by(command: list[str]) -> str:
    """Who set a run's telemetry interval to 0: its command line, or the study or sweep that
    ran it (a study on a CPU host samples nothing: there are no power or thermal sensors)."""
    if any(a.startswith("--telemetry-interval-ms") for a in command):
        return "--telemetry-interval-ms 0"
    if "study" in command:
        return "the study samples nothing on a CPU host: it has no power or thermal sensors"
    if "sweep" in command:
        return "telemetry_interval_ms 0 in the sweep file"
    return "telemetry_interval_ms 0"


def _no_heatmap_reason(view: RunView) -> str:
    platform = view.bundle.manifest.platform
    if not platform.get("chassis"):
        return f"platform {platform['name']} declares no chassis layout"
    if not view.stats:
        return _no_samples_reason(view.bundle, ("power_w", "temp_gpu_c"))
    return "the GPUs with samples are not in the platform's chassis layout"


def _steps_fact(bundle: Bundle) -> str:
    """Steps that ran by phase, against those asked for."""
    cfg = bundle.manifest.config
    steps = bundle.steps.select(["step", "phase"])  # millions of rows: counted in arrow
    ran = {p: pc.count_distinct(steps.filter(pc.equal(steps["phase"], p))["step"]).as_py()
           for p in ("warmup", "measured")}
    return (f"{ran['warmup']} of {cfg.get('warmup', '?')} warmup and {ran['measured']} of "
            f"{cfg.get('steps', '?')} measured steps ran")


def _telemetry_fact(view: RunView) -> str:
    series = view.power or view.temp or view.clock
    if not series:
        return _no_samples_reason(view.bundle, ("power_w", "temp_gpu_c", "cpu_power_w"))
    counts = sorted({len(s.t) for s in series})
    span = max(float(s.t[-1] - s.t[0]) for s in series)
    per = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    what = "host" if series[0].device < 0 else "GPU"
    return (f"{per} samples per {what} over {span:.1f} s ({len(series)} {what}"
            f"{'s' if len(series) > 1 else ''}), {view.period_text()}")


def _pct(value: float) -> str:
    return f"{value * 100:+.1f}%"


def _energy_fact(bundle: Bundle) -> str:
    """The energy cross-checks (counter against the power integral and Zeus), flagged above
    :data:`ENERGY_CHECK_LIMIT`."""
    power = bundle.metrics.power
    parts = [f"{name} {_pct(v)}" for key, name in (
        ("counter_vs_integral", "counter vs power integral"),
        ("zeus_vs_counter", "Zeus vs counter")) if isinstance(v := power.get(key), int | float)]
    if not parts:
        return "no cross-check recorded in this bundle"
    worst = energy_check(bundle) or 0.0
    flag = (f"; DISAGREE by more than {ENERGY_CHECK_LIMIT:.0%}: energy per token is uncertain "
            "by as much" if worst > ENERGY_CHECK_LIMIT else f"; within {ENERGY_CHECK_LIMIT:.0%}")
    return ", ".join(parts) + flag


def _peak_fact(bundle: Bundle) -> str | None:
    """What peak power, peak-to-mean and excursions rest on: the field, samples and window."""
    exact = instantaneous(bundle)
    if exact is None:
        return None
    what = ("instantaneous (the highest power_w sample)" if exact else
            "from the driver's averaged power (it smooths peaks)")
    samples, window = power_samples(bundle), window_s(bundle)
    rests = (f"; rests on {samples:.0f} samples per GPU (fewest)" if samples is not None
             else "") + (f" over a {window:.1f} s window" if window is not None else "")
    short = ("; WINDOW TOO SHORT for meaningful peaks (fewer samples than the minimum, "
             "docs/metrics.md)" if window_short(bundle) else "")
    return what + rests + short


def _temp_fact(bundle: Bundle) -> str | None:
    """Whether each GPU's temperature reached a steady state within the window."""
    slopes = [(d.get("device"), d.get("temp_slope_c_per_min"), d.get("temp_steady"))
              for d in bundle.metrics.per_device]
    known = [(dev, slope, steady) for dev, slope, steady in slopes if steady is not None]
    if not known:
        return None
    rising = [f"dev{dev} {slope:+.1f} °C/min" if isinstance(slope, int | float) else f"dev{dev}"
              for dev, slope, steady in known if not steady]
    if not rising:
        return f"steady within the window on all {len(known)} GPUs"
    return f"NOT steady at the window's end (still changing): {', '.join(rising)}"


def _facts(bundle: Bundle, view: RunView) -> list[tuple[str, str]]:
    m = bundle.manifest
    verified = ("yes: checksums and schemas match" if bundle.verification_error is None else
                f"NO: {bundle.verification_error}; reported only because of --allow-unverified")
    gpus = [str(g.get("name")) for node in m.inventory for g in node.gpus]
    facts = [("bundle", bundle.path.name),
             ("status", m.status + (f": {m.error}" if m.error else "")),
             ("steps", _steps_fact(bundle)),
             ("verified", verified),
             ("workload", m.workload["name"]),
             ("platform", f"{m.platform['name']} ({m.platform.get('device_name', '')}), "
                          f"{len(m.inventory)} node{'s' if len(m.inventory) > 1 else ''}"
                          + (f", {len(gpus)} x {gpus[0]}" if gpus else "")),
             ("ranks", str(len(m.ranks))),
             *((("devices", "; ".join(f"{r.place}: {r.role}" for r in view.roles)),)
               if view.roles else ()),
             ("engine and layout", layout_label(m.config)),
             ("dtype", m.config["dtype"]),
             ("telemetry", _telemetry_fact(view)),
             *((("peak power", peak),) if (peak := _peak_fact(bundle)) else ()),
             ("energy cross-check", _energy_fact(bundle)),
             *((("temperature", temp),) if (temp := _temp_fact(bundle)) else ()),
             ("stragglers", straggler_line(bundle.metrics.stragglers)),
             ("created", m.created_utc)]
    scaling = m.workload.get("scaling")
    if scaling:
        facts.insert(5, ("scaled", f"from {scaling['original']['name']} by the "
                                   f"{scaling['platform']} rule: {scaling['rule']['reason']}"))
    return facts


def _projection_section(n: int, group: Group, bundle: Bundle) -> Section:
    """A projection's section: no figures (it has no telemetry), its layout, inputs, intervals
    and assumptions.
    """
    m = bundle.manifest
    facts = [("workload", m.workload["name"]), ("platform", m.platform["name"]),
             ("ranks", str(len(m.ranks))), ("engine and layout", layout_label(m.config)),
             ("created", m.created_utc)]
    return Section(f"bundle-{n}", f"{group.short} (projected)", bundle,
                   facts + projection_facts(projection_of(bundle)), [])


def _run_name(group: Group, bundle: Bundle) -> str:
    """The run's configuration, and which of its group's repeats it is."""
    where = "" if len(group.bundles) == 1 else (
        f" (run {group.bundles.index(bundle) + 1} of {len(group.bundles)})")
    return f"{group.short}{where}"


def _section(n: int, group: Group, view: RunView) -> Section:
    """Facts and own figures of bundle ``n`` (kernels, expert load); its timelines and chassis
    heatmaps are rows of figures of several runs (:func:`_run_figures`)."""
    bundle = view.bundle
    name = _run_name(group, bundle)
    no_profile = "no profile in this bundle (charllm-kit run --profile records one)"
    figures = [
        FigureJob(f"kernel-breakdown-{n}", "kernel time", f"Kernel time by category: {name}.",
                  lambda: plots_run.kernel_breakdown(kernel_times(bundle), view), no_profile),
    ]
    if bundle.experts is not None:  # mixture-of-experts runs only
        figures.append(FigureJob(
            f"expert-load-{n}", "tokens per expert",
            "Tokens each expert received over the measured steps relative to an even share, "
            f"per MoE layer, and the busiest expert over the mean per step: {name}.",
            lambda: plots_experts.expert_load(view), "no measured step counted its routing"))
    return Section(f"bundle-{n}", name, bundle, _facts(bundle, view), figures)


@dataclass(frozen=True)
class _Kind:
    """One kind of figure of several runs: its ids, words, what it draws and who is in it."""

    anchor: str
    """A run's anchor (its own figure's id before small multiples): ``power-timeline``."""
    figure: str
    title: str
    caption: str
    draw: Callable[[list[plots_run.RunRow], Scales], Figure | None]
    rows: Callable[[list[plots_run.RunRow]], list[int]]
    """The run number of each row it draws, top to bottom (a run of several nodes has a row
    per node in the heatmaps)."""
    missing: Callable[[RunView], str]
    """Why a run is not in it."""
    remark: Callable[[RunView], str]
    """What to know when reading a run's rows of it ("" when nothing)."""


def _power_remark(view: RunView) -> str:
    """What to know when reading a run's power and temperature rows: a window too short for
    its peaks, whether the temperature settled."""
    short = (" The measured window was too short for meaningful peaks: fewer power samples "
             "than the minimum (docs/metrics.md)." if window_short(view.bundle) else "")
    temp = _temp_fact(view.bundle)
    return short + (f" Temperature: {temp}." if temp else "")


def _chassis_remark(view: RunView) -> str:
    """What to know when reading a run's heatmap rows: a scope other than the measured steps,
    assumed positions."""
    scope = f" Over the {view.scope}." if view.scope != "measured steps" else ""
    return scope + (" Chassis positions are ASSUMED by the platform profile, not read from "
                    "this system." if chassis_assumed(view.bundle.manifest.platform) else "")


_KINDS = (
    _Kind("power-timeline", "power-timelines", "power and temperature",
          "Power (with the power limit) and GPU temperature of every device over time, a row "
          "per run, step windows shaded",
          plots_run.power_timelines, lambda rows: [r.n for r in plots_run.power_rows(rows)],
          lambda v: _no_samples_reason(v.bundle, ("power_w", "temp_gpu_c", "cpu_power_w")),
          _power_remark),
    _Kind("clock-throttle", "clock-throttle-timelines", "SM clock and throttling",
          "SM clock and active throttle reasons over time, a row per run",
          plots_run.clock_throttle_timelines,
          lambda rows: [r.n for r in plots_run.clock_rows(rows)],
          lambda v: _no_samples_reason(v.bundle, ("clock_sm_mhz", "throttle")),
          lambda v: ""),
    _Kind("chassis-heatmap", "chassis-heatmaps", "chassis heatmaps",
          "Mean temperature and power per GPU by node and chassis position, a row per run and "
          "node, one colour scale per quantity set by the runs that ended ok",
          plots_run.chassis_heatmaps,
          lambda rows: [p.row.n for p in plots_run.chassis_panels(rows)], _no_heatmap_reason,
          _chassis_remark),
)


def _run_figures(sections: list[tuple[int, Section, RunView]], scales: Scales,
                 ) -> list[tuple[list[FigureJob], dict[int, list[RunPanel]]]]:
    """The figures of several runs, :data:`~kit.analysis.plots_run.ROWS_PER_FIGURE` runs
    each, and per run number where its rows are."""
    rows = [plots_run.RunRow(n, s.title, v) for n, s, v in sections]
    views = {n: v for n, _, v in sections}
    out = []
    for k, chunk in enumerate(plots_run.chunks(rows), 1):
        jobs, panels = [], {r.n: [] for r in chunk}
        span = f"runs {chunk[0].n}-{chunk[-1].n}" if len(chunk) > 1 else f"run {chunk[0].n}"
        for kind in _KINDS:
            drawn = kind.rows(chunk)
            fig_id = f"{kind.figure}-{k}"
            listed = "; ".join(f"{r.n}. {r.name} ({r.view.bundle.path.name})" for r in chunk
                               if r.n in drawn)
            if drawn:
                jobs.append(FigureJob(fig_id, f"{kind.title}, {span}",
                                      f"{kind.caption}. Rows: {listed}.",
                                      lambda kind=kind, chunk=chunk: kind.draw(chunk, scales),
                                      ""))
            for r in chunk:
                at = [i for i, n in enumerate(drawn, 1) if n == r.n]
                if not at:
                    where = kind.missing(views[r.n])
                elif len(at) == 1:
                    where = f"row {at[0]} of {len(drawn)}"
                else:
                    where = f"rows {at[0]}-{at[-1]} of {len(drawn)}"
                panels[r.n].append(RunPanel(f"{kind.anchor}-{r.n}", kind.title,
                                            fig_id if at else None, where,
                                            kind.remark(views[r.n]) if at else ""))
        out.append((jobs, panels))
    return out


TITLE = "charllm-kit report"
"""The report's heading unless its caller names it (the study names itself)."""


@dataclass(frozen=True)
class Opening:
    """What a caller says first, under the heading (the study: what was measured on what, and
    what could not be and why), rendered by the caller for each format."""

    html: str
    markdown: str


@dataclass(frozen=True)
class Report:
    """Everything the report shows, before it is written in one format."""

    comparison: Comparison
    across: list[FigureItem]
    """Figures across configurations (and notes for those no bundle can have)."""
    sections: list[Section]
    created_utc: str
    lead: list[LeadSection] = field(default_factory=list)
    """Sections shown first (the study's Findings), in order."""
    title: str = TITLE
    opening: Opening | None = None
    """Said first, under the heading."""

    @property
    def drawn(self) -> list[FigureItem]:
        """The figures across configurations that have something to show."""
        return [a for a in self.across if a.png is not None]


def _not_drawn(report: Report) -> str | None:
    """One line naming the figures across configurations with nothing to show, grouped by
    why, instead of a placeholder each; None when every one was drawn."""
    why: dict[str, list[str]] = {}
    for a in report.across:
        if a.png is None:
            why.setdefault(a.note, []).append(a.title)
    if not why:
        return None
    return "Nothing to draw, so left out: " + "; ".join(
        f"{', '.join(titles)}: {note}" for note, titles in why.items()) + "."


def _across(c: Comparison, views: dict[str, RunView]) -> list[FigureJob]:
    """Figures across configurations; ``views`` holds each group's first run, by label."""
    shared = f" All configurations: {shared_phrase(c.shared)}." if c.shared else ""
    no_gpu = "no bundle has per-GPU telemetry"
    no_profile = "no bundle has a profile breakdown (charllm-kit run --profile records one)"
    items = [
        FigureJob("config-bars", "Throughput, MFU, energy, peak power",
                  "Throughput, MFU, energy per token, peak power and time in power excursions per "
                  "configuration, by workload "
                  "and fastest first; failed runs are marked, unmeasured values say n/a."
                  + shared,
                  lambda: plots_cross.configuration_bars(c), ""),
        FigureJob("efficiency", "Energy efficiency",
                  "Throughput against energy per token, colour = mean power per device; samples "
                  f"(sequences) per MJ of device energy beside it.{shared}",
                  lambda: plots_cross.efficiency(c),
                  "no configuration measured both throughput and energy per token"),
        FigureJob("per-gpu", "Power, temperature and SM clock per GPU",
                  "Per GPU and configuration: mean and peak power, mean and max temperature, mean "
                  "and lowest SM clock over the measured steps of the configuration's first run."
                  + shared, lambda: plots_cross.per_gpu(c, views), no_gpu),
        FigureJob("gpu-heatmap", "GPUs in node order",
                  "GPUs in node order per configuration: mean temperature, power and link traffic "
                  f"over the measured steps, one colour scale each.{shared}",
                  lambda: plots_cross.gpu_heatmap(c, views), no_gpu),
        FigureJob("profile-breakdowns", "Time by category per pipeline stage",
                  "Share of the profiled steps per category, per configuration and pipeline stage "
                  f"(kit.metrics.kernels).{shared}", lambda: plots_cross.stage_breakdown(c),
                  no_profile),
        FigureJob("exposed-comm", "Exposed communication",
                  "Communication per configuration and collective type: exposed (nothing "
                  "computed meanwhile) and overlapped with compute, as shares of the profiled "
                  f"steps.{shared}",
                  lambda: plots_cross.exposed_communication(c), no_profile),
    ]
    items += [
        FigureJob("sweep", "Against the swept parameter",
                  "Throughput, MFU, mean and peak power, energy per token, excursion time and "
                  "exposed communication against the parameter the configurations sweep (the "
                  "configuration's median over repeats), each from zero: a line joins "
                  "configurations that differ in nothing else (world size, other degrees, "
                  "batch, precision, engine, execution mode), a point is one that no other "
                  f"matches.{shared}",
                  lambda: plots_study.sweep_lines(c),
                  "no two configurations differ in one parameter only (micro-batch size or a "
                  "parallel degree; world size, batch, precision, engine and execution mode "
                  "alike)"),
        FigureJob("link-traffic", "Link traffic over time",
                  "NVLink/xGMI and PCIe bytes per second of all GPUs over time, one line per "
                  f"layout (its first run), from the first measured step.{shared}",
                  lambda: plots_study.link_timelines(c, views),
                  "no bundle recorded link or PCIe byte counters"),
        FigureJob("position-timelines", "Temperature and SM clock per position",
                  "Temperature and SM clock at each chassis position over time, one line per "
                  f"layout (its first run; dashed: did not end ok).{shared}",
                  lambda: plots_study.position_timelines(c, views), no_gpu),
        FigureJob("throttle-timelines", "Throttle reasons over time",
                  "Share of each layout's GPUs held by each active throttle reason over "
                  f"time.{shared}", lambda: plots_study.throttle_timelines(c, views),
                  "no throttle reason was recorded active in any run"),
    ]
    curves = fabric_curves(c.bundles)
    if curves:
        items.append(FigureJob("fabric-busbw", "Fabric bus bandwidth",
                               "Fabric bus bandwidth against message size (charllm-kit fabric).",
                               lambda: plots_cross.fabric_busbw(curves), ""))
    return items


def _drawn(jobs: list[FigureJob], pngs: dict[str, bytes | None]) -> list[FigureItem]:
    return [FigureItem(j.id, j.title, j.caption, pngs[j.id], "" if pngs[j.id] else j.note)
            for j in jobs]


def _views(bundles: list[Bundle]) -> dict[int, RunView]:
    """Each bundle's view by ``id(bundle)``, made in forked workers (the bundle itself stays
    here: only the view's own data comes back)."""
    def view(index: int) -> RunView:
        return replace(run_view(bundles[index]), bundle=None)  # type: ignore[arg-type]

    made = map_forked(view, len(bundles))
    return {id(b): replace(v, bundle=b) for b, v in zip(bundles, made, strict=True)}


def _shared(first: int, chunk: tuple[int, int, list[FigureItem]] | None,
            ) -> tuple[list[FigureItem], str, str]:
    """The figures of runs ``first`` to the chunk's last, their anchor and heading."""
    if chunk is None:
        return [], "", ""
    k, last, figures = chunk
    runs = f"Runs {first}-{last}" if last > first else f"Run {first}"
    return figures, f"runs-{k}", f"{runs}: timelines and chassis heatmaps"


def build_report(paths: list[str | Path], allow_unverified: bool = False,
                 baseline: str | Path | None = None,
                 lead: Sequence[LeadSection] = (), title: str = TITLE,
                 opening: Opening | None = None, markdown: bool = False,
                 swept: Collection[str] | None = None) -> Report:
    """Verify and compare the bundles and draw every figure (once each, in parallel).

    Args:
        paths: Bundle directories or sweep folders (:mod:`kit.analysis.inputs`).
        allow_unverified: Report bundles that fail verification (marked) instead of refusing.
        baseline: The bundle the comparison relates the others to (it must have ended ok).
        lead: Sections to put first, before the ranking (the study's Findings).
        title: The report's heading.
        opening: What to say first, under the heading.
        markdown: The report will be Markdown: the bundles' Markdown marks are escaped.
        swept: The axes varied on purpose (the study's factors), said in the checks as such
            instead of flagged; None: those of one sweep folder the bundles came from
            (:func:`kit.analysis.compare.compare_bundles`).

    Raises:
        KitInputError: As :func:`kit.analysis.compare.compare_bundles`.
    """
    c = compare_bundles(paths, baseline, allow_unverified=allow_unverified, markdown=markdown,
                        swept=swept)
    views = _views([b for b in c.bundles if projection_of(b) is None])
    scales = Scales.of(list(views.values()))
    first = {g.label: views[id(g.bundles[0])] for g in c.groups if id(g.bundles[0]) in views}
    group_of = {id(b): g for g in c.groups for b in g.bundles}
    sections = [_projection_section(n, group_of[id(b)], b) if projection_of(b) is not None
                else _section(n, group_of[id(b)], views[id(b)])
                for n, b in enumerate(c.bundles, 1)]
    runs = _run_figures([(n, s, views[id(s.bundle)]) for n, s in enumerate(sections, 1)
                         if projection_of(s.bundle) is None], scales)
    across = _across(c, first)
    jobs = across + [j for chunk, _ in runs for j in chunk] + [
        j for s in sections for j in s.figures]
    pngs = dict(zip((j.id for j in jobs), render_all([j.draw for j in jobs]), strict=True))
    panels = {n: p for _, chunk in runs for n, p in chunk.items()}
    shared = {min(chunk): (k, max(chunk), _drawn(figs, pngs))
              for k, (figs, chunk) in enumerate(runs, 1) if figs}
    sections = [Section(s.id, s.title, s.bundle, s.facts, _drawn(s.figures, pngs),
                        panels.get(n, []), *_shared(n, shared.get(n)))
                for n, s in enumerate(sections, 1)]
    return Report(c, _drawn(across, pngs), sections,
                  datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), list(lead), title,
                  opening)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; color: #222;
       padding: 0 0.6em; overflow-wrap: anywhere; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0; overflow-wrap: normal; }
.scroll { overflow-x: auto; max-width: 100%; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { white-space: pre-line; background: #f3f3f3; vertical-align: bottom; }
td:first-child, th:first-child { text-align: left; }
table.ranking td:nth-child(2) { text-align: left; white-space: nowrap; }
tr.workload th { text-align: left; background: #e4e9f0; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { font-size: 0.9em; color: #444; } .note { color: #a05000; font-style: italic; }
p.panel { margin: 0.3em 0; }
.checks li { margin: 0.3em 0; } dl { display: grid; grid-template-columns: max-content auto; }
dt { font-weight: bold; padding-right: 1em; } dd { margin: 0; min-width: 0; }
nav { font-size: 0.9em; } .sub { color: #666; font-size: 0.9em; }
@media (max-width: 600px) { dl { grid-template-columns: auto; } }
"""


def _unverified_warning(report: Report) -> str | None:
    """A warning naming the bundles that failed verification, or None when all verified."""
    names = [b.path.name for b in report.comparison.bundles if b.verification_error is not None]
    if not names:
        return None
    return ("Warning: failed verification, reported only because of --allow-unverified (the "
            f"figures may have been edited): {', '.join(names)}.")


def _intro(report: Report) -> str:
    c = report.comparison
    text = (f"{sum(len(g.bundles) for g in c.groups)} bundles in {len(c.groups)} "
            f"configurations; written {report.created_utc} by charllm-kit "
            f"{kit.__version__}. Values are the median [min..max] over repeats; "
            "n/a = not measured.")
    if c.baseline is not None:
        text += (f" Baseline: {c.groups[c.baseline].short}; ratios for throughput, time, "
                 "energy, power and memory, differences for temperatures (°C) and shares "
                 "(percentage points).")
    return text


def _contents(report: Report) -> list[tuple[int, str, str]]:
    """(level, anchor, title) of every part, for the table of contents."""
    items = [(1, lead.id, lead.title) for lead in report.lead]
    items += [(1, "comparison", "Comparison"), (1, "comparability", "Comparability"),
              (1, "across", "Across configurations")]
    items += [(2, f.id, f.title) for f in report.drawn]
    items += [(1, "runs", "Runs")]
    for n, s in enumerate(report.sections, 1):
        items += [(2, s.shared_id, s.shared_title)] if s.shared else []
        items += [(2, s.id, f"{n}. {s.title}")]
    return items


def figure_file(item: FigureItem) -> str:
    """The file name of a figure in the report's figure folder."""
    return f"{item.id}.png"


def _html_figure(item: FigureItem, folder: str | None) -> str:
    """A figure linked from ``folder``, or inlined as a ``data:`` URI when ``folder`` is None."""
    caption = html.escape(item.caption)
    if item.png is None:
        return (f'<figure id="{item.id}"><p class="note">{html.escape(item.note)}</p>'
                f"<figcaption>{caption}</figcaption></figure>")
    src = (f"data:image/png;base64,{base64.b64encode(item.png).decode('ascii')}"
           if folder is None else f"{html.escape(folder)}/{figure_file(item)}")
    return (f'<figure id="{item.id}"><img src="{src}" '
            f'alt="{caption}"><figcaption>{caption}</figcaption></figure>')


def _panel_titles(report: Report) -> dict[str, str]:
    """The title of every figure of several runs, by id."""
    return {f.id: f.title for s in report.sections for f in s.shared}


def _html_panel(panel: RunPanel, titles: dict[str, str]) -> str:
    """A run's pointer at its rows, linked; or why it has none."""
    if panel.figure is None:
        return (f'<p class="panel" id="{panel.id}">{html.escape(panel.title)}: '
                f'<span class="note">{html.escape(panel.where)}</span></p>')
    figure = titles.get(panel.figure, panel.figure)
    return (f'<p class="panel" id="{panel.id}">{html.escape(panel.title)}: '
            f'<a href="#{panel.figure}">{html.escape(panel.where)} in the figure '
            f"“{html.escape(figure)}”</a>.{html.escape(panel.remark)}</p>")


def _html_contents(report: Report) -> str:
    tree: list[tuple[str, str, list[tuple[str, str]]]] = []
    for depth, anchor, text in _contents(report):
        if depth == 1:
            tree.append((anchor, text, []))
        else:
            tree[-1][2].append((anchor, text))

    def link(anchor: str, text: str) -> str:
        return f'<a href="#{anchor}">{html.escape(text)}</a>'

    items = "".join(
        f"<li>{link(a, t)}" + (f"<ul>{''.join(f'<li>{link(*c)}</li>' for c in kids)}</ul>"
                               if kids else "") + "</li>" for a, t, kids in tree)
    return f"<nav><h2>Contents</h2><ul>{items}</ul></nav>"


def _all_metrics_html(c: Comparison) -> str:
    """Every metric of every configuration (per-reason throttling, stragglers) and against the
    baseline, folded under the ranking."""
    grids = "".join(f'<div class="scroll">{g}</div>' for g in metric_grids(c, "\n", "html"))
    notes = "".join(f"<p>{html.escape(n)}</p>" for n in table_notes(c))
    return f"<details><summary>All metrics</summary>{grids}{notes}</details>"


def render_html(report: Report, folder: str | None = None) -> str:
    """The report as one HTML page; figures linked from ``folder`` (relative to the page), or
    inlined when it is None."""
    c = report.comparison
    checks = "".join(f"<li>{html.escape(line)}</li>" for line in check_lines(c.checks))
    warning = _unverified_warning(report)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(report.title)}</title>",
        f"<style>{_STYLE}</style></head><body>", f"<h1>{html.escape(report.title)}</h1>",
        *([report.opening.html] if report.opening else []),
        f"<p>{html.escape(_intro(report))}</p>",
        *([f'<p class="note" id="unverified">{html.escape(warning)}</p>'] if warning else []),
        _html_contents(report),
    ]
    for lead in report.lead:
        parts += [f'<h2 id="{lead.id}">{html.escape(lead.title)}</h2>', lead.html,
                  *(_html_figure(f, folder) for f in lead.figures)]
    parts += [
        '<h2 id="comparison">Comparison</h2>', ranking_html(c), _all_metrics_html(c),
        '<h2 id="comparability">Comparability</h2>', f'<ul class="checks">{checks}</ul>',
        '<h2 id="across">Across configurations</h2>',
        *(_html_figure(a, folder) for a in report.drawn),
        *(f'<p class="sub" id="not-drawn">{html.escape(line)}</p>'
          for line in [_not_drawn(report)] if line),
        '<h2 id="runs">Runs</h2>',
    ]
    titles = _panel_titles(report)
    for n, s in enumerate(report.sections, 1):
        facts = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in s.facts)
        if s.shared:
            parts += [f'<h3 id="{s.shared_id}">{html.escape(s.shared_title)}</h3>',
                      *(_html_figure(f, folder) for f in s.shared)]
        parts += [f'<h3 id="{s.id}">{n}. {html.escape(s.title)}</h3>',
                  f'<p class="sub">{html.escape(s.bundle.path.name)}</p>',
                  f"<dl>{facts}</dl>", *(_html_panel(p, titles) for p in s.panels),
                  *(_html_figure(f, folder) for f in s.figures)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _md_figure(item: FigureItem, folder: str) -> str:
    if item.png is None:
        return f'<a id="{item.id}"></a>\n\n*{item.caption}* {item.note}.'
    return (f'<a id="{item.id}"></a>\n\n![{item.title}]({folder}/{figure_file(item)})\n\n'
            f"*{item.caption}*")


def _md_panel(panel: RunPanel, titles: dict[str, str]) -> str:
    if panel.figure is None:
        return f'<a id="{panel.id}"></a>*{panel.title}*: {panel.where}.'
    return (f'<a id="{panel.id}"></a>*{panel.title}*: [{panel.where} in the figure '
            f"“{titles.get(panel.figure, panel.figure)}”](#{panel.figure}).{panel.remark}")


def _figures(report: Report) -> list[FigureItem]:
    """Every figure of the report, in page order."""
    return [*(f for lead in report.lead for f in lead.figures), *report.drawn,
            *(f for s in report.sections for f in (*s.shared, *s.figures))]


def render_markdown(report: Report, folder: str) -> str:
    """The report as Markdown, its figures linked from ``folder``."""
    c = report.comparison
    checks = "\n".join(f"- {line}" for line in check_lines(c.checks))
    warning = _unverified_warning(report)
    contents = "\n".join(f"{'  ' * (depth - 1)}- [{text}](#{anchor})"
                         for depth, anchor, text in _contents(report))
    parts = [
        f"# {report.title}", *([report.opening.markdown] if report.opening else []),
        _intro(report), *([f"**{warning}**"] if warning else []),
        "## Contents", contents,
    ]
    for lead in report.lead:
        parts += [f'<a id="{lead.id}"></a>\n\n## {lead.title}', lead.markdown,
                  *(_md_figure(f, folder) for f in lead.figures)]
    parts += [
        '<a id="comparison"></a>\n\n## Comparison', ranking_text(c, "github"),
        *ranking_notes(c), "### All metrics", *metric_grids(c, "<br>", "github"),
        *table_notes(c),
        '<a id="comparability"></a>\n\n## Comparability', checks,
        '<a id="across"></a>\n\n## Across configurations',
        *(_md_figure(a, folder) for a in report.drawn),
        *(line for line in [_not_drawn(report)] if line),
        '<a id="runs"></a>\n\n## Runs',
    ]
    titles = _panel_titles(report)
    for n, s in enumerate(report.sections, 1):
        facts = safe_table(s.facts, headers=("", ""), tablefmt="github",
                           disable_numparse=True)
        if s.shared:
            parts += [f'<a id="{s.shared_id}"></a>\n\n### {s.shared_title}',
                      *(_md_figure(f, folder) for f in s.shared)]
        parts += [f'<a id="{s.id}"></a>\n\n### {n}. {s.title}', facts,
                  *(_md_panel(p, titles) for p in s.panels),
                  *(_md_figure(f, folder) for f in s.figures)]
    return markdown_safe("\n\n".join(parts) + "\n")


def write_report(paths: list[str | Path], out: Path, markdown: bool = False,
                 allow_unverified: bool = False, baseline: str | Path | None = None,
                 single_file: bool = False, lead: Sequence[LeadSection] = (),
                 title: str = TITLE, opening: Opening | None = None,
                 swept: Collection[str] | None = None) -> list[Path]:
    """Build the report on ``paths`` (:func:`build_report`) and write it to ``out``, its
    figures into ``<stem>_figures/`` beside it (inlined instead with ``single_file``, HTML
    only); return the files written, the report first."""
    return write_built(build_report(paths, allow_unverified, baseline, lead, title, opening,
                                    markdown, swept), out, markdown, single_file)


def write_built(report: Report, out: Path, markdown: bool = False,
                single_file: bool = False) -> list[Path]:
    """Write a built report to ``out`` (see :func:`write_report`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if single_file and not markdown:
        out.write_text(render_html(report), encoding="utf-8")
        return [out]
    folder = out.parent / f"{out.stem}_figures"
    folder.mkdir(exist_ok=True)
    written = [out]
    for item in _figures(report):
        if item.png is not None:
            (folder / figure_file(item)).write_bytes(item.png)
            written.append(folder / figure_file(item))
    text = render_markdown(report, folder.name) if markdown else render_html(report, folder.name)
    out.write_text(text, encoding="utf-8")
    return written
