"""The study's findings as a report section (HTML), figures beside it, JSON and a terminal table.

A finding's figure is drawn only under a verdict whose numbers are evidence (agrees,
disagrees): under ``confounded`` or ``not measurable here`` its numbers would read as support
for a verdict they cannot give, so the entry says why there is no figure instead.
"""

import html
import json
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tabulate import tabulate

import kit
from kit.analysis.plots_common import png_bytes
from kit.analysis.plots_findings import finding_figure, is_evidence
from kit.study.verdicts import FindingResult

FIGURE_DIR = "findings"
"""Folder beside the report that holds one PNG per finding with a figure."""
_VERDICT_COLOR = {"agrees": "#1a7f37", "disagrees": "#b35900", "confounded": "#a2145a",
                  "not measurable here": "#666"}


def _has_figure(r: FindingResult) -> bool:
    return r.plot is not None and is_evidence(r.verdict) and any(r.plot.series.values())


def _no_figure(r: FindingResult) -> str | None:
    """Why a finding with figure data shows none (module docstring), or None."""
    if r.plot is None or _has_figure(r):
        return None
    return (f"No figure: under a {r.verdict} verdict its numbers are not evidence on the "
            "finding (they are in the evidence below).")


def _factor(r: FindingResult) -> str | None:
    """The finding's factor and what else may differ, in one line."""
    if r.held is None:
        return None
    by_reason: dict[str, list[str]] = {}
    for key, why in r.held.free.items():
        by_reason.setdefault(why, []).append(key)
    free = "; ".join(f"{', '.join(keys)} ({why})" for why, keys in by_reason.items())
    return (f"Varies: {', '.join(sorted(r.held.factor))}. Everything else held fixed"
            + (f", except {free}" if free else "") + " (docs/study.md).")


def _unverified_among(r: FindingResult, unverified: Mapping[str, str]) -> list[str]:
    return sorted(set(r.bundles) & set(unverified))


def write_figures(results: list[FindingResult], folder: Path) -> dict[str, Path]:
    """One PNG per finding whose verdict is evidence and that has a figure, in ``folder``;
    finding id -> file."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for r in results:
        fig = None if r.plot is None else finding_figure(r.plot, r.finding.title, r.verdict)
        if fig is not None:
            path = folder / f"{r.finding.id}.png"
            path.write_bytes(png_bytes(fig))
            out[r.finding.id] = path
    return out


def findings_html(results: list[FindingResult], figures: dict[str, str],
                  unverified: Mapping[str, str] | None = None) -> str:
    """The body of the report's Findings section: a verdict table, then one entry per finding.

    Args:
        results: The findings, in the study's order.
        figures: Finding id -> the figure's path relative to the report.
        unverified: Bundle name -> why it failed verification, for bundles used only because
            of ``--allow-unverified``.
    """
    unverified = unverified or {}
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
        differs = "".join(f"<li>{html.escape(d.describe())}</li>" for d in r.differs)
        marked = _unverified_among(r, unverified)
        factor, no_figure = _factor(r), _no_figure(r)
        parts += [
            f'<h3 id="finding-{r.finding.id}">{html.escape(r.finding.title)}: '
            f'<span style="color:{_VERDICT_COLOR[r.verdict]}">{r.verdict}</span></h3>',
            f"<p><b>The study:</b> {html.escape(r.finding.reported)}</p>",
            f"<p><b>This node:</b> {html.escape(r.why)}.</p>",
            *([f'<p><b style="color:{_VERDICT_COLOR["confounded"]}">Differs beyond the '
               f"factor:</b></p><ul>{differs}</ul>"] if differs else []),
            *([f'<p class="sub">{html.escape(factor)}</p>'] if factor else []),
            *([f'<figure><img src="{html.escape(fig)}" alt="{html.escape(r.finding.title)}">'
               "</figure>"] if fig else []),
            *([f'<p class="sub">{html.escape(no_figure)}</p>'] if no_figure else []),
            *([f"<p><b>Unverified:</b> rests on {html.escape(', '.join(marked))}, used only "
               "because of --allow-unverified: their files may have been edited.</p>"]
              if marked else []),
            f"<details><summary>evidence</summary><pre>{evidence}</pre></details>",
            f'<p class="sub">Bundles: {bundles}</p>',
        ]
    return "\n".join(parts)


def findings_markdown(results: list[FindingResult], figures: dict[str, str],
                      unverified: Mapping[str, str] | None = None) -> str:
    """The Findings section as Markdown (see :func:`findings_html`)."""
    unverified = unverified or {}
    table = tabulate([[f"[{r.finding.title}](#finding-{r.finding.id})", r.verdict]
                      for r in results], headers=["finding", "verdict"], tablefmt="github")
    parts = [table]
    for r in results:
        fig = figures.get(r.finding.id)
        marked = _unverified_among(r, unverified)
        factor, no_figure = _factor(r), _no_figure(r)
        parts += [f'<a id="finding-{r.finding.id}"></a>\n\n### {r.finding.title}: {r.verdict}',
                  f"**The study:** {r.finding.reported}", f"**This node:** {r.why}.",
                  *(["**Differs beyond the factor:**\n\n"
                     + "\n".join(f"- {d.describe()}" for d in r.differs)] if r.differs else []),
                  *([factor] if factor else []),
                  *([f"![{r.finding.title}]({fig})"] if fig else []),
                  *([no_figure] if no_figure else []),
                  *([f"**Unverified:** rests on {', '.join(marked)}, used only because of "
                     "--allow-unverified: their files may have been edited."] if marked else []),
                  f"Bundles: {', '.join(sorted(set(r.bundles))) or 'none'}"]
    return "\n\n".join(parts)


def findings_json(results: list[FindingResult], node: str,
                  unverified: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``<node>-findings.json``: one entry per finding (finding, verdict, factor, what differs,
    evidence, bundles, the unverified ones among them), and ``unverified``: bundle name -> why
    it failed verification, for bundles used only because of ``--allow-unverified``."""
    unverified = dict(unverified or {})
    return {"node": node, "kit_version": kit.__version__,
            "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "unverified": unverified,
            "findings": [{**r.as_json(), "unverified_bundles": _unverified_among(r, unverified)}
                         for r in results]}


def findings_table(results: list[FindingResult]) -> str:
    """The verdicts for the terminal: one row per finding with its reason."""
    return tabulate([[r.finding.id, r.verdict, r.why] for r in results],
                    headers=["finding", "verdict", "why"], tablefmt="simple",
                    maxcolwidths=[None, None, 90])
