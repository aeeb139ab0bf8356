"""Assemble a report on bundles: the comparison, its checks and every figure, as one file.

HTML is self-contained: figures are PNGs embedded as base64 ``data:`` URIs and the style is
inline, so the file can be mailed or attached as is. Markdown writes the same figures as PNG
files in a folder beside the report (``<name>_figures/``) and links them relatively, which is
what Markdown viewers render. Both open with a table of contents.

Figures across configurations come first (:mod:`kit.analysis.plots_cross`), then one section
per bundle, named by its configuration (:mod:`kit.analysis.plots_run`). Each figure has a
stable id and a caption; a figure a bundle cannot have is replaced by a note saying why, from
what the bundle holds (no samples, the sampler off, a field's recorded reason, no chassis
layout, no profile). Every bundle's telemetry is drawn whatever its status: a failed run's
samples up to the crash are kept, and its figures say how it ended.

Every bundle is verified before it is used. One that failed and is reported only because of
``--allow-unverified`` is named in a warning under the title, flagged in the comparison and
its checks, and its own section says what failed.
"""

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

from matplotlib.figure import Figure
from tabulate import tabulate

from kit.analysis import plots_cross, plots_run
from kit.analysis.compare import Comparison, Group, compare_bundles
from kit.analysis.compare_format import check_lines, metric_grids, table_notes
from kit.analysis.kernels import kernel_times
from kit.analysis.labels import layout_label, shared_phrase
from kit.analysis.plots_common import png_bytes
from kit.analysis.run_view import RunView, Scales, run_view
from kit.analysis.side_by_side import fabric_curves
from kit.analysis.stragglers import straggler_line
from kit.bundle.reader import Bundle
from kit.project.file import projection_facts


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
class Section:
    """One bundle's part of the report."""

    id: str
    title: str
    """The bundle's configuration (its group's short label), how it ended."""
    bundle: Bundle
    facts: list[tuple[str, str]]
    figures: list[FigureItem]


@dataclass(frozen=True)
class LeadSection:
    """A section a caller puts first in the report, before the comparison (the study's Findings).

    Its body is given already rendered for each format; its figures follow the body.
    """

    id: str
    title: str
    html: str
    """The section's body as HTML (escaped by the caller)."""
    markdown: str
    figures: list[FigureItem] = field(default_factory=list)


def _item(fig_id: str, title: str, caption: str, fig: Figure | None, note: str) -> FigureItem:
    return FigureItem(fig_id, title, caption, png_bytes(fig) if fig is not None else None,
                      "" if fig is not None else note)


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
        why = ("the sampler was off (--telemetry-interval-ms 0)" if interval == 0
               else "the sampler recorded none")
        return f"no telemetry samples in this bundle: {why}"
    return "no samples of " + "; ".join(_field_reason(bundle, f) for f in fields)


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
    phases = bundle.steps.select(["step", "phase"]).to_pylist()
    ran = {p: len({r["step"] for r in phases if r["phase"] == p}) for p in ("warmup", "measured")}
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
             ("engine and layout", layout_label(m.config)),
             ("dtype", m.config["dtype"]),
             ("telemetry", _telemetry_fact(view)),
             ("stragglers", straggler_line(bundle.metrics.stragglers)),
             ("created", m.created_utc)]
    scaling = m.workload.get("scaling")
    if scaling:
        facts.insert(5, ("scaled", f"from {scaling['original']['name']} by the "
                                   f"{scaling['platform']} rule: {scaling['rule']['reason']}"))
    return facts


def _projection_section(n: int, group: Group, bundle: Bundle) -> Section:
    """A projection's section: no figures (it has no telemetry), its layout, inputs, intervals
    and assumptions."""
    m = bundle.manifest
    facts = [("workload", m.workload["name"]), ("platform", m.platform["name"]),
             ("ranks", str(len(m.ranks))), ("engine and layout", layout_label(m.config)),
             ("created", m.created_utc)]
    return Section(f"bundle-{n}", f"{group.short} (projected)", bundle,
                   facts + projection_facts(bundle.projection), [])


def _section(n: int, group: Group, view: RunView, scales: Scales) -> Section:
    """Figures of bundle ``n``: power and temperature, chassis heatmaps, clock and throttle,
    kernels.
    """
    bundle = view.bundle
    where = "" if len(group.bundles) == 1 else (
        f" (run {group.bundles.index(bundle) + 1} of {len(group.bundles)})")
    name = f"{group.short}{where}"
    no_profile = "no profile in this bundle (charllm-kit run --profile records one)"
    figures = [
        _item(f"power-timeline-{n}", "power and temperature",
              "Power (with the power limit) and temperature of every device over time, step "
              f"windows shaded: {name}.", plots_run.power_timeline(view, scales),
              _no_samples_reason(bundle, ("power_w", "temp_gpu_c", "cpu_power_w"))),
        _item(f"chassis-heatmap-{n}", "chassis heatmaps",
              f"Mean temperature and power per GPU over the {view.scope}, by node and chassis "
              f"position: {name}.", plots_run.chassis_heatmaps(view, scales),
              _no_heatmap_reason(view)),
        _item(f"clock-throttle-{n}", "SM clock and throttling",
              f"SM clock and active throttle reasons over time: {name}.",
              plots_run.clock_and_throttle(view, scales),
              _no_samples_reason(bundle, ("clock_sm_mhz", "throttle"))),
        _item(f"kernel-breakdown-{n}", "kernel time", f"Kernel time by category: {name}.",
              plots_run.kernel_breakdown(kernel_times(bundle), view), no_profile),
    ]
    return Section(f"bundle-{n}", name, bundle, _facts(bundle, view), figures)


@dataclass(frozen=True)
class Report:
    """Everything the report shows, before it is written in one format."""

    comparison: Comparison
    across: list[FigureItem]
    """Figures across configurations (and notes for those no bundle can have)."""
    sections: list[Section]
    created_utc: str
    lead: list[LeadSection] = field(default_factory=list)
    """Sections before the comparison, in order."""


def _across(c: Comparison, views: dict[str, RunView]) -> list[FigureItem]:
    """Figures across configurations; ``views`` holds each group's first run, by label."""
    shared = f" All configurations: {shared_phrase(c.shared)}." if c.shared else ""
    no_gpu = "no bundle has per-GPU telemetry"
    no_profile = "no bundle has a profile breakdown (charllm-kit run --profile records one)"
    items = [
        _item("config-bars", "Throughput, MFU, energy, peak power",
              "Throughput, MFU, energy per token and peak power per configuration, by workload "
              "and fastest first; failed runs are marked, unmeasured values say n/a."
              + shared,
              plots_cross.configuration_bars(c), ""),
        _item("efficiency", "Energy efficiency",
              "Throughput against energy per token, colour = mean power per device; samples "
              f"(sequences) per MJ of device energy beside it.{shared}",
              plots_cross.efficiency(c),
              "no configuration measured both throughput and energy per token"),
        _item("per-gpu", "Power, temperature and SM clock per GPU",
              "Per GPU and configuration: mean and peak power, mean and max temperature, mean "
              "and lowest SM clock over the measured steps of the configuration's first run."
              + shared, plots_cross.per_gpu(c, views), no_gpu),
        _item("gpu-heatmap", "GPUs in node order",
              "GPUs in node order per configuration: mean temperature, power and link traffic "
              f"over the measured steps, one colour scale each.{shared}",
              plots_cross.gpu_heatmap(c, views), no_gpu),
        _item("profile-breakdowns", "Time by category per pipeline stage",
              "Share of the profiled steps per category, per configuration and pipeline stage "
              f"(kit.analysis.kernels).{shared}", plots_cross.stage_breakdown(c), no_profile),
        _item("exposed-comm", "Exposed communication",
              "Communication per configuration and collective type: exposed (nothing computed "
              f"meanwhile) and overlapped with compute, as shares of the profiled steps.{shared}",
              plots_cross.exposed_communication(c), no_profile),
    ]
    fabric = plots_cross.fabric_busbw(fabric_curves(c.bundles))
    if fabric is not None:
        items.append(_item("fabric-busbw", "Fabric bus bandwidth",
                           "Fabric bus bandwidth against message size (charllm-kit fabric).",
                           fabric, ""))
    return items


def build_report(paths: list[str | Path], allow_unverified: bool = False,
                 baseline: str | Path | None = None,
                 lead: Sequence[LeadSection] = ()) -> Report:
    """Verify and compare the bundles and draw every figure.

    Args:
        paths: Bundle directories or sweep folders (:mod:`kit.analysis.inputs`).
        allow_unverified: Report bundles that fail verification (marked) instead of refusing.
        baseline: The bundle the comparison relates the others to (it must have ended ok).
        lead: Sections to put first, before the comparison (the study's Findings).

    Raises:
        KitInputError: As :func:`kit.analysis.compare.compare_bundles`.
    """
    c = compare_bundles(paths, baseline, allow_unverified=allow_unverified)
    views = {id(b): run_view(b) for b in c.bundles if b.projection is None}
    scales = Scales.of(list(views.values()))
    first = {g.label: views[id(g.bundles[0])] for g in c.groups if id(g.bundles[0]) in views}
    group_of = {id(b): g for g in c.groups for b in g.bundles}
    sections = [_projection_section(n, group_of[id(b)], b) if b.projection is not None
                else _section(n, group_of[id(b)], views[id(b)], scales)
                for n, b in enumerate(c.bundles, 1)]
    return Report(c, _across(c, first), sections,
                  datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), list(lead))


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { white-space: pre-line; background: #f3f3f3; vertical-align: bottom; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.9em; color: #444; } .note { color: #a05000; font-style: italic; }
.checks li { margin: 0.3em 0; } dl { display: grid; grid-template-columns: max-content auto; }
dt { font-weight: bold; padding-right: 1em; } dd { margin: 0; }
nav { font-size: 0.9em; } .sub { color: #666; font-size: 0.9em; }
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
            f"{version('charllm-kit')}. Values are the median [min..max] over repeats; "
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
    items += [(2, f.id, f.title) for f in report.across]
    items += [(1, "runs", "Runs")]
    items += [(2, s.id, f"{n}. {s.title}") for n, s in enumerate(report.sections, 1)]
    return items


def _html_figure(item: FigureItem) -> str:
    caption = html.escape(item.caption)
    if item.png is None:
        return (f'<figure id="{item.id}"><p class="note">{html.escape(item.note)}</p>'
                f"<figcaption>{caption}</figcaption></figure>")
    data = base64.b64encode(item.png).decode("ascii")
    return (f'<figure id="{item.id}"><img src="data:image/png;base64,{data}" '
            f'alt="{caption}"><figcaption>{caption}</figcaption></figure>')


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


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page."""
    c = report.comparison
    checks = "".join(f"<li>{html.escape(line)}</li>" for line in check_lines(c.checks))
    notes = "".join(f"<p>{html.escape(n)}</p>" for n in table_notes(c))
    warning = _unverified_warning(report)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>charllm-kit report</title>", f"<style>{_STYLE}</style></head><body>",
        "<h1>charllm-kit report</h1>", f"<p>{html.escape(_intro(report))}</p>",
        *([f'<p class="note" id="unverified">{html.escape(warning)}</p>'] if warning else []),
        _html_contents(report),
    ]
    for lead in report.lead:
        parts += [f'<h2 id="{lead.id}">{html.escape(lead.title)}</h2>', lead.html,
                  *(_html_figure(f) for f in lead.figures)]
    parts += [
        '<h2 id="comparison">Comparison</h2>', *metric_grids(c, "\n", "html"), notes,
        '<h2 id="comparability">Comparability</h2>', f'<ul class="checks">{checks}</ul>',
        '<h2 id="across">Across configurations</h2>',
        *(_html_figure(a) for a in report.across),
        '<h2 id="runs">Runs</h2>',
    ]
    for n, s in enumerate(report.sections, 1):
        facts = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in s.facts)
        parts += [f'<h3 id="{s.id}">{n}. {html.escape(s.title)}</h3>',
                  f'<p class="sub">{html.escape(s.bundle.path.name)}</p>',
                  f"<dl>{facts}</dl>", *(_html_figure(f) for f in s.figures)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _md_figure(item: FigureItem, folder: str) -> str:
    if item.png is None:
        return f'<a id="{item.id}"></a>\n\n*{item.caption}* {item.note}.'
    return (f'<a id="{item.id}"></a>\n\n![{item.title}]({folder}/{item.id}.png)\n\n'
            f"*{item.caption}*")


def render_markdown(report: Report, folder: str) -> tuple[str, dict[str, bytes]]:
    """The report as Markdown, and its figures as ``{file name: PNG}`` for ``folder``."""
    c = report.comparison
    checks = "\n".join(f"- {line}" for line in check_lines(c.checks))
    warning = _unverified_warning(report)
    contents = "\n".join(f"{'  ' * (depth - 1)}- [{text}](#{anchor})"
                         for depth, anchor, text in _contents(report))
    parts = [
        "# charllm-kit report", _intro(report),
        *([f"**{warning}**"] if warning else []),
        "## Contents", contents,
    ]
    for lead in report.lead:
        parts += [f'<a id="{lead.id}"></a>\n\n## {lead.title}', lead.markdown,
                  *(_md_figure(f, folder) for f in lead.figures)]
    parts += [
        '<a id="comparison"></a>\n\n## Comparison', *metric_grids(c, "<br>", "github"),
        *table_notes(c),
        '<a id="comparability"></a>\n\n## Comparability', checks,
        '<a id="across"></a>\n\n## Across configurations',
        *(_md_figure(a, folder) for a in report.across),
        '<a id="runs"></a>\n\n## Runs',
    ]
    for n, s in enumerate(report.sections, 1):
        facts = tabulate(s.facts, headers=("", ""), tablefmt="github", disable_numparse=True)
        parts += [f'<a id="{s.id}"></a>\n\n### {n}. {s.title}', facts,
                  *(_md_figure(f, folder) for f in s.figures)]
    items = [*(f for lead in report.lead for f in lead.figures), *report.across,
             *(f for s in report.sections for f in s.figures)]
    return "\n\n".join(parts) + "\n", {f"{i.id}.png": i.png for i in items if i.png is not None}


def write_report(paths: list[str | Path], out: Path, markdown: bool = False,
                 allow_unverified: bool = False,
                 baseline: str | Path | None = None,
                 lead: Sequence[LeadSection] = ()) -> list[Path]:
    """Build the report on ``paths`` and write it to ``out``; return the files written.

    ``lead``: sections to put first (:class:`LeadSection`).
    """
    report = build_report(paths, allow_unverified, baseline, lead)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not markdown:
        out.write_text(render_html(report), encoding="utf-8")
        return [out]
    folder = out.parent / f"{out.stem}_figures"
    text, pngs = render_markdown(report, folder.name)
    folder.mkdir(exist_ok=True)
    written = [out]
    for name, png in pngs.items():
        (folder / name).write_bytes(png)
        written.append(folder / name)
    out.write_text(text, encoding="utf-8")
    return written
