"""Render a :class:`~kit.analysis.compare.Comparison` as a table, Markdown, CSV or JSON.

Table and Markdown put the comparability checks under the figures, where a reader sees them;
CSV keeps stdout one parseable table and leaves the checks to stderr; JSON carries them in a
``checks`` list. A missing value is ``n/a`` (``null`` in JSON), never 0. A group of bundles
that failed verification (``--allow-unverified``) says ``UNVERIFIED`` in its column header and
``[unverified]`` in its label, ``verified`` false in CSV and JSON, and has an ``unverified``
check.
"""

import csv
import io
import json
from typing import Any, Literal

from tabulate import tabulate

from kit.analysis.comparability import Check
from kit.analysis.compare import METRICS, Aggregate, Comparison, Group
from kit.analysis.side_by_side import side_by_side_dict, side_by_side_text
from kit.analysis.stragglers import straggler_line

Format = Literal["table", "markdown", "csv", "json"]
NA = "n/a"
_LISTED = 3
"""Bundle ids listed per group before the rest are counted."""


def format_value(value: float | None, unit: str) -> str:
    """One value for people: fractions as percent, 4 significant digits, ``n/a`` for None."""
    if value is None:
        return NA
    if unit == "fraction":
        return f"{value * 100:.1f}%"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _cell(agg: Aggregate, unit: str) -> str:
    """Median, with ``[min..max]`` when repeats differ."""
    if agg.n == 0:
        return NA
    median = format_value(agg.median, unit)
    if agg.min == agg.max:
        return median
    return f"{median} [{format_value(agg.min, unit)}..{format_value(agg.max, unit)}]"


def _ratio_cell(ratio: float | None) -> str:
    return NA if ratio is None else f"x{ratio:.3g} ({(ratio - 1) * 100:+.1f}%)"


def _row_label(label: str, unit: str) -> str:
    return label if unit in ("fraction", "ratio") or label.startswith(unit) else f"{label} ({unit})"


def metric_grid(c: Comparison, newline: str, tablefmt: str) -> str:
    """The metric table: a column per group, and one against the baseline after each other."""
    headers = ["metric"]
    for i, g in enumerate(c.groups):
        headers.append(newline.join(g.header() + (["(baseline)"] if i == c.baseline else [])))
        if c.baseline is not None and i != c.baseline:
            headers.append("vs baseline")
    rows = []
    for m in METRICS:
        row = [_row_label(m.label, m.unit)]
        for i, g in enumerate(c.groups):
            row.append(_cell(g.values[m.key], m.unit))
            if c.baseline is not None and i != c.baseline:
                row.append(_ratio_cell(c.ratio(g, m.key)))
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True,
                    colalign=("left",) + ("right",) * (len(headers) - 1))


def _bundle_list(g: Group) -> str:
    ids = [b.path.name for b in g.bundles]
    more = f" and {len(ids) - _LISTED} more" if len(ids) > _LISTED else ""
    return ", ".join(ids[:_LISTED]) + more


def check_lines(checks: list[Check]) -> list[str]:
    """One line per check, ``[kind] message``, or one line saying there is nothing to flag."""
    if not checks:
        return ["none: same workload, platform, precision, batch, sequence length, telemetry "
                "sources and schema; every run ended ok"]
    return [f"[{c.kind}] {c.message}" for c in checks]


def _text(c: Comparison, markdown: bool) -> str:
    """Table or Markdown: title line, metric table, groups and comparability checks."""
    runs = sum(len(g.bundles) for g in c.groups)
    title = (f"{runs} bundle{'s' if runs > 1 else ''} in {len(c.groups)} "
             f"group{'s' if len(c.groups) > 1 else ''}; values are the median "
             "[min..max] over repeats")
    if c.baseline is not None:
        title += f"; baseline: {c.groups[c.baseline].label}"
    bullet = "- " if markdown else "  "
    groups = [f"{bullet}{g.label}: {_bundle_list(g)}" for g in c.groups]
    checks = [f"{bullet}{line}" for line in check_lines(c.checks)]
    grid = metric_grid(c, "<br>", "github") if markdown else metric_grid(c, "\n", "simple")
    heading = "**{}**" if markdown else "{}:"
    extra = side_by_side_text(c.bundles, "github" if markdown else "simple")
    slow = [f"{bullet}{b.path.name}: {straggler_line(b.metrics.stragglers)}"
            for b in c.bundles if b.metrics.stragglers]
    return "\n\n".join([title, grid, heading.format("groups") + "\n" + "\n".join(groups),
                        heading.format("comparability") + "\n" + "\n".join(checks),
                        *([heading.format("stragglers") + "\n" + "\n".join(slow)] if slow else []),
                        *([extra] if extra else [])]) + "\n"


def _pct(ratio: float | None) -> float | None:
    return None if ratio is None else (ratio - 1) * 100


def comparison_dict(c: Comparison) -> dict[str, Any]:
    """The comparison as plain JSON data (``null`` where not measured)."""
    groups = []
    for g in c.groups:
        m = g.first
        groups.append({
            "label": g.label, "workload": m.workload["name"], "platform": m.platform["name"],
            "layout": g.header()[2], "dtype": m.config["dtype"], "status": g.status,
            "verified": g.verified,
            "bundles": [str(b.path) for b in g.bundles],
            "metrics": {row.key: {**vars(g.values[row.key]),
                                  "ratio_to_baseline": c.ratio(g, row.key),
                                  "pct_diff_to_baseline": _pct(c.ratio(g, row.key))}
                        for row in METRICS},
        })
    return {
        "baseline": c.groups[c.baseline].label if c.baseline is not None else None,
        "metrics": [vars(row) for row in METRICS],
        "groups": groups,
        "checks": [vars(check) for check in c.checks],
        "stragglers": {b.path.name: b.metrics.stragglers for b in c.bundles},
        **side_by_side_dict(c.bundles),
    }


def _csv(c: Comparison) -> str:
    """Long form: one line per metric per group."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["metric", "label", "unit", "group", "status", "verified", "runs", "n",
                     "median", "min", "max", "ratio_to_baseline", "pct_diff_to_baseline"])
    for g in c.groups:
        for row in METRICS:
            agg, ratio = g.values[row.key], c.ratio(g, row.key)
            writer.writerow([row.key, row.label, row.unit, g.label, g.status,
                             str(g.verified).lower(), len(g.bundles),
                             agg.n, *(NA if v is None else repr(v)
                                      for v in (agg.median, agg.min, agg.max, ratio,
                                                _pct(ratio)))])
    return out.getvalue()


def render_comparison(c: Comparison, fmt: Format) -> tuple[str, str]:
    """The comparison in ``fmt``, as (stdout text, stderr text).

    stderr carries the comparability checks for CSV only (the other formats include them).
    """
    if fmt == "json":
        return json.dumps(comparison_dict(c), indent=2) + "\n", ""
    if fmt == "csv":
        return _csv(c), "".join(f"comparability: {line}\n" for line in check_lines(c.checks))
    return _text(c, markdown=fmt == "markdown"), ""
