"""Assemble a report on bundles: the comparison, its checks and every figure, as one file.

HTML is self-contained: figures are PNGs embedded as base64 ``data:`` URIs and the style is
inline, so the file can be mailed or attached as is. Markdown writes the figures as PNG files
in a folder beside the report (``<name>_figures/``) and links them relatively, which is what
Markdown viewers render. Each figure has a stable id (``config-bars``,
``power-timeline-<n>``, ``chassis-heatmap-<n>``, ``clock-throttle-<n>``,
``kernel-breakdown-<n>``, ``n`` the bundle's position) and a caption; a figure a bundle cannot
have (no GPU telemetry, no chassis layout, no profile) is replaced by a note saying why.

Every bundle is verified before it is used. One that failed and is reported only because of
``--allow-unverified`` is named in a warning under the title, flagged in the comparison and
its checks, and its own section says what failed.
"""

import base64
import html
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

from matplotlib.figure import Figure
from tabulate import tabulate

from kit.analysis import plots
from kit.analysis.compare import Comparison, compare_bundles, layout_label
from kit.analysis.compare_format import check_lines, metric_grid
from kit.analysis.kernels import kernel_times
from kit.analysis.side_by_side import fabric_curves, profile_shares
from kit.analysis.stragglers import straggler_line
from kit.bundle.reader import Bundle


@dataclass(frozen=True)
class FigureItem:
    """One figure of the report, or the note that stands in for it."""

    id: str
    caption: str
    png: bytes | None
    note: str = ""
    """Why there is no figure (when ``png`` is None)."""


@dataclass(frozen=True)
class Section:
    """One bundle's part of the report."""

    bundle: Bundle
    facts: list[tuple[str, str]]
    figures: list[FigureItem]


def _item(fig_id: str, caption: str, fig: Figure | None, note: str) -> FigureItem:
    return FigureItem(fig_id, caption, plots.png_bytes(fig) if fig is not None else None,
                      "" if fig is not None else note)


def _no_power_reason(bundle: Bundle) -> str:
    """Why a bundle has no power trace, from its telemetry sources."""
    sources = bundle.manifest.telemetry_sources
    reasons = [f"{name}: {(s.reason if (s := sources.get(name)) else None) or 'no samples'}"
               for name in ("power_w", "cpu_power_w")]
    return "no power telemetry in this bundle (" + "; ".join(reasons) + ")"


def _no_heatmap_reason(bundle: Bundle) -> str:
    """Why a bundle has no chassis heatmap."""
    platform = bundle.manifest.platform
    if not platform.get("chassis"):
        return f"platform {platform['name']} declares no chassis layout"
    return "no per-device GPU telemetry over the measured steps"


def _facts(bundle: Bundle) -> list[tuple[str, str]]:
    m = bundle.manifest
    verified = ("yes: checksums and schemas match" if bundle.verification_error is None else
                f"NO: {bundle.verification_error}; reported only because of --allow-unverified")
    facts = [("status", m.status + (f": {m.error}" if m.error else "")),
             ("verified", verified),
             ("workload", m.workload["name"]),
             ("platform", f"{m.platform['name']} ({m.platform.get('device_name', '')})"),
             ("ranks", str(len(m.ranks))),
             ("layout", layout_label(m.config)),
             ("dtype", m.config["dtype"]),
             ("stragglers", straggler_line(bundle.metrics.stragglers)),
             ("created", m.created_utc)]
    scaling = m.workload.get("scaling")
    if scaling:
        facts.insert(2, ("scaled", f"from {scaling['original']['name']} by the "
                                   f"{scaling['platform']} rule: {scaling['rule']['reason']}"))
    return facts


def _section(n: int, bundle: Bundle) -> Section:
    """Figures of bundle ``n``: power, chassis heatmaps, clock and throttle, kernels."""
    title = plots.bundle_title(bundle)
    figures = [
        _item(f"power-timeline-{n}", f"Power of every device over time, step windows shaded: "
                                     f"{title}.", plots.power_timeline(bundle),
              _no_power_reason(bundle)),
        _item(f"chassis-heatmap-{n}", f"Mean temperature and power per device over the "
                                      f"measured steps, by node and chassis position: {title}.",
              plots.chassis_heatmaps(bundle), _no_heatmap_reason(bundle)),
        _item(f"clock-throttle-{n}", f"SM clock and active throttle reasons over time: {title}.",
              plots.clock_and_throttle(bundle), "no SM clock or throttle telemetry"),
        _item(f"kernel-breakdown-{n}", f"Kernel time by category: {title}.",
              plots.kernel_breakdown(kernel_times(bundle), title),
              "no profile in this bundle"),
    ]
    return Section(bundle, _facts(bundle), figures)


@dataclass(frozen=True)
class Report:
    """Everything the report shows, before it is written in one format."""

    comparison: Comparison
    bars: FigureItem
    across: list[FigureItem]
    """Profile breakdowns and fabric curves of all bundles side by side (when any has them)."""
    sections: list[Section]
    created_utc: str


def build_report(paths: list[str | Path], allow_unverified: bool = False) -> Report:
    """Verify and compare the bundles and draw every figure.

    Args:
        paths: Bundle directories.
        allow_unverified: Report bundles that fail verification (marked) instead of refusing.

    Raises:
        KitInputError: As :func:`kit.analysis.compare.compare_bundles`.
    """
    comparison = compare_bundles(paths, allow_unverified=allow_unverified)
    bars = _item("config-bars", "Throughput, MFU, energy per token and peak power per "
                                "configuration; failed runs are marked, unmeasured values "
                                "say n/a.", plots.configuration_bars(comparison), "")
    across = [_item("profile-breakdowns", "Share of the profiled steps per category, per bundle "
                                          "and rank (kit.analysis.kernels).",
                    plots.profile_breakdowns(profile_shares(comparison.bundles)), ""),
              _item("fabric-busbw", "Fabric bus bandwidth against message size "
                                    "(charllm-kit fabric).",
                    plots.fabric_busbw(fabric_curves(comparison.bundles)), "")]
    return Report(comparison, bars, [a for a in across if a.png is not None],
                  [_section(n, b) for n, b in enumerate(comparison.bundles, 1)],
                  datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))


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
"""


def _unverified_warning(report: Report) -> str | None:
    """A warning naming the bundles that failed verification, or None when all verified."""
    names = [b.path.name for b in report.comparison.bundles if b.verification_error is not None]
    if not names:
        return None
    return ("Warning: failed verification, reported only because of --allow-unverified (the "
            f"figures may have been edited): {', '.join(names)}.")


def _html_figure(item: FigureItem) -> str:
    caption = html.escape(item.caption)
    if item.png is None:
        return (f'<figure id="{item.id}"><p class="note">{html.escape(item.note)}</p>'
                f"<figcaption>{caption}</figcaption></figure>")
    data = base64.b64encode(item.png).decode("ascii")
    return (f'<figure id="{item.id}"><img src="data:image/png;base64,{data}" '
            f'alt="{caption}"><figcaption>{caption}</figcaption></figure>')


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page."""
    c = report.comparison
    checks = "".join(f"<li>{html.escape(line)}</li>" for line in check_lines(c.checks))
    warning = _unverified_warning(report)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>charllm-kit report</title>", f"<style>{_STYLE}</style></head><body>",
        "<h1>charllm-kit report</h1>",
        f"<p>{sum(len(g.bundles) for g in c.groups)} bundles in {len(c.groups)} groups; "
        f"written {report.created_utc} by charllm-kit {version('charllm-kit')}. Values are "
        "the median [min..max] over repeats; n/a = not measured.</p>",
        *([f'<p class="note" id="unverified">{html.escape(warning)}</p>'] if warning else []),
        '<h2 id="comparison">Comparison</h2>', metric_grid(c, "\n", "html"),
        '<h2 id="comparability">Comparability</h2>', f'<ul class="checks">{checks}</ul>',
        _html_figure(report.bars), *(_html_figure(a) for a in report.across),
    ]
    for n, s in enumerate(report.sections, 1):
        facts = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in s.facts)
        parts += [f'<h2 id="bundle-{n}">{n}. {html.escape(s.bundle.path.name)}</h2>',
                  f"<dl>{facts}</dl>", *(_html_figure(f) for f in s.figures)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _md_figure(item: FigureItem, folder: str) -> str:
    if item.png is None:
        return f'<a id="{item.id}"></a>\n\n*{item.caption}* {item.note}.'
    return (f'<a id="{item.id}"></a>\n\n![{item.caption}]({folder}/{item.id}.png)\n\n'
            f"*{item.caption}*")


def render_markdown(report: Report, folder: str) -> tuple[str, dict[str, bytes]]:
    """The report as Markdown, and its figures as ``{file name: PNG}`` for ``folder``."""
    c = report.comparison
    checks = "\n".join(f"- {line}" for line in check_lines(c.checks))
    warning = _unverified_warning(report)
    parts = [
        "# charllm-kit report",
        f"{sum(len(g.bundles) for g in c.groups)} bundles in {len(c.groups)} groups; written "
        f"{report.created_utc} by charllm-kit {version('charllm-kit')}. Values are the median "
        "[min..max] over repeats; n/a = not measured.",
        *([f"**{warning}**"] if warning else []),
        "## Comparison", metric_grid(c, "<br>", "github"),
        "## Comparability", checks, _md_figure(report.bars, folder),
        *(_md_figure(a, folder) for a in report.across),
    ]
    for n, s in enumerate(report.sections, 1):
        facts = tabulate(s.facts, headers=("", ""), tablefmt="github", disable_numparse=True)
        parts += [f"## {n}. {s.bundle.path.name}", facts,
                  *(_md_figure(f, folder) for f in s.figures)]
    items = [report.bars, *report.across, *(f for s in report.sections for f in s.figures)]
    return "\n\n".join(parts) + "\n", {f"{i.id}.png": i.png for i in items if i.png is not None}


def write_report(paths: list[str | Path], out: Path, markdown: bool = False,
                 allow_unverified: bool = False) -> list[Path]:
    """Build the report on ``paths`` and write it to ``out``; return the files written."""
    report = build_report(paths, allow_unverified)
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
