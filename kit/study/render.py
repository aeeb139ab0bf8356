"""The study's findings as a report section (HTML), figures beside it, JSON and a terminal table."""

import html
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from tabulate import tabulate

import kit
from kit.analysis.plots_common import colors, png_bytes
from kit.study.verdicts import FindingResult, Plot

FIGURE_DIR = "findings"
"""Folder beside the report that holds one PNG per finding with a figure."""
_VERDICT_COLOR = {"agrees": "#1a7f37", "disagrees": "#b35900", "not measurable here": "#666"}


def _draw(plot: Plot, title: str) -> Figure:
    fig = Figure(figsize=(6.4, 3.6), layout="constrained")
    ax = fig.add_subplot()
    palette = colors(len(plot.series))
    if plot.kind == "line":
        for (name, points), color in zip(plot.series.items(), palette, strict=True):
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name,
                    color=color)
    else:
        cats = list(dict.fromkeys(str(x) for pts in plot.series.values() for x, _ in pts))
        width = 0.8 / max(len(plot.series), 1)
        for i, ((name, points), color) in enumerate(zip(plot.series.items(), palette,
                                                        strict=True)):
            values = dict((str(x), y) for x, y in points)
            ax.bar([c + i * width for c in range(len(cats))],
                   [values.get(c, 0.0) for c in cats], width, label=name, color=color)
        ax.set_xticks([c + width * (len(plot.series) - 1) / 2 for c in range(len(cats))],
                      cats, rotation=20, ha="right", fontsize=8)
    ax.set_xlabel(plot.x_label)
    ax.set_ylabel(plot.y_label)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def write_figures(results: list[FindingResult], folder: Path) -> dict[str, Path]:
    """One PNG per finding that has a figure, in ``folder``; finding id -> file."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for r in results:
        if r.plot is not None and any(r.plot.series.values()):
            path = folder / f"{r.finding.id}.png"
            path.write_bytes(png_bytes(_draw(r.plot, r.finding.title)))
            out[r.finding.id] = path
    return out


def findings_html(results: list[FindingResult], figures: dict[str, str]) -> str:
    """The body of the report's Findings section: a verdict table, then one entry per finding.

    Args:
        results: The findings, in the study's order.
        figures: Finding id -> the figure's path relative to the report.
    """
    rows = "".join(
        f'<tr><td><a href="#finding-{r.finding.id}">{html.escape(r.finding.title)}</a></td>'
        f'<td style="color:{_VERDICT_COLOR[r.verdict]}">{r.verdict}</td></tr>' for r in results)
    parts = ["<p>Each finding of the reference study (Go et al., MICRO 2025), what this node "
             "measured, and whether it agrees. Thresholds and how causes are separated: "
             "docs/study.md.</p>",
             f"<table><tr><th>finding</th><th>verdict</th></tr>{rows}</table>"]
    for r in results:
        fig = figures.get(r.finding.id)
        bundles = ", ".join(html.escape(b) for b in sorted(set(r.bundles))) or "none"
        evidence = html.escape(json.dumps(r.evidence, indent=1))
        parts += [
            f'<h3 id="finding-{r.finding.id}">{html.escape(r.finding.title)}: '
            f'<span style="color:{_VERDICT_COLOR[r.verdict]}">{r.verdict}</span></h3>',
            f"<p><b>The study:</b> {html.escape(r.finding.reported)}</p>",
            f"<p><b>This node:</b> {html.escape(r.why)}.</p>",
            *([f'<figure><img src="{html.escape(fig)}" alt="{html.escape(r.finding.title)}">'
               "</figure>"] if fig else []),
            f"<details><summary>evidence</summary><pre>{evidence}</pre></details>",
            f'<p class="sub">Bundles: {bundles}</p>',
        ]
    return "\n".join(parts)


def findings_markdown(results: list[FindingResult], figures: dict[str, str]) -> str:
    """The Findings section as Markdown (see :func:`findings_html`)."""
    table = tabulate([[f"[{r.finding.title}](#finding-{r.finding.id})", r.verdict]
                      for r in results], headers=["finding", "verdict"], tablefmt="github")
    parts = [table]
    for r in results:
        fig = figures.get(r.finding.id)
        parts += [f'<a id="finding-{r.finding.id}"></a>\n\n### {r.finding.title}: {r.verdict}',
                  f"**The study:** {r.finding.reported}", f"**This node:** {r.why}.",
                  *([f"![{r.finding.title}]({fig})"] if fig else []),
                  f"Bundles: {', '.join(sorted(set(r.bundles))) or 'none'}"]
    return "\n\n".join(parts)


def findings_json(results: list[FindingResult], node: str) -> dict[str, Any]:
    """``<node>-findings.json``: one entry per finding (finding, verdict, evidence, bundles)."""
    return {"node": node, "kit_version": kit.__version__,
            "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "findings": [r.as_json() for r in results]}


def findings_table(results: list[FindingResult]) -> str:
    """The verdicts for the terminal: one row per finding with its reason."""
    return tabulate([[r.finding.id, r.verdict, r.why] for r in results],
                    headers=["finding", "verdict", "why"], tablefmt="simple",
                    maxcolwidths=[None, None, 90])
