"""Render a :class:`~kit.analysis.compare.Comparison` as a table, Markdown, CSV or JSON.

Table and Markdown open with the ranking (:mod:`kit.analysis.ranking`: a row per
configuration), then the metric grid ("all metrics") and the comparability checks under it,
where a reader sees them (one line per distinct check);
their column headers leave out what every group shares (said once above the table), per-reason
throttle rows that are 0 or unmeasured in every group are left out (named under the table), and
a table wider than :data:`MAX_WIDTH` characters is split into several, each with the metric
column, so a comparison of many layouts stays readable in a terminal and on a page;
CSV keeps stdout one parseable table and leaves the checks to stderr; JSON carries them in a
``checks`` list. A missing value is ``n/a`` (``null`` in JSON), never 0. A group of bundles
that failed verification (``--allow-unverified``) says ``UNVERIFIED`` in its column header and
``[unverified]`` in its label, ``verified`` false in CSV and JSON, and has an ``unverified``
check.
"""

import csv
import io
import json
import math
from typing import Any, Literal

from kit.analysis.comparability import Check
from kit.analysis.compare import METRICS, Aggregate, Comparison, Group, MetricRow
from kit.analysis.side_by_side import side_by_side_dict, side_by_side_text
from kit.metrics.labels import layout_label, shared_phrase
from kit.metrics.stragglers import straggler_line
from kit.metrics.text import NA, format_value
from kit.neutralize import csv_safe, markdown_safe, safe_table, terminal_safe
from kit.projection.file import projection_of

Format = Literal["table", "markdown", "csv", "json"]
_LISTED = 3
"""Bundle ids listed per group before the rest are counted."""
MAX_WIDTH = 120
"""Characters a metric table may take before it is split into several."""
_HEADER_WIDTH = 22
"""Characters per line of a column header before it wraps."""
_UNITS = {"C": "°C"}
"""How a unit is written for people, where it differs from its key."""


ESTIMATED = frozenset({"mem_peak_gib"})
"""Metrics a projection takes from kit.plan's estimate, not from its model of measured time."""
ESTIMATE = " (estimate)"


def _cell(agg: Aggregate, unit: str) -> str:
    """Median, with ``[min..max]`` when repeats differ."""
    if agg.n == 0:
        return NA
    median = format_value(agg.median, unit)
    if agg.min == agg.max:
        return median
    return f"{median} [{format_value(agg.min, unit)}..{format_value(agg.max, unit)}]"


def unit_text(unit: str) -> str:
    """A unit as people read it (``°C`` for ``C``)."""
    return _UNITS.get(unit, unit)


def versus_cell(c: Comparison, g: Group, row: MetricRow) -> str:
    """A group against the baseline: ``x1.04 (+4.2%)``, or a difference in the metric's unit
    (``-2.0 °C``, ``+3.1 pp`` for fractions, ``+0.12`` for a ratio metric).
    """
    if row.versus == "ratio":
        ratio = c.ratio(g, row.key)
        if ratio is None:
            return NA
        return f"x{ratio:.3f} ({(ratio - 1) * 100:+.1f}%)" if ratio < 10 else f"x{ratio:.1f}"
    diff = c.difference(g, row.key)
    if diff is None:
        return NA
    if row.unit == "fraction":
        return f"{diff * 100:+.1f} pp"
    if row.unit in ("ratio", "count"):
        return f"{diff:+.3g}"
    return f"{diff:+.1f} {unit_text(row.unit)}"


def row_label(row: MetricRow) -> str:
    """A metric's name with its unit, e.g. ``step time (s)``; fractions and ratios have none."""
    if row.unit in ("fraction", "ratio", "count") or row.label.split()[0] == row.unit:
        return row.label
    return f"{row.label} ({unit_text(row.unit)})"


def shown_rows(c: Comparison) -> tuple[list[MetricRow], list[str]]:
    """The rows a table shows, and the per-reason throttle rows left out because every group
    has 0 or nothing there (by reason name).
    """
    rows, quiet = [], []
    for m in METRICS:
        if m.key.startswith("throttle_frac_by_reason.") and not any(
                g.values[m.key].max for g in c.groups):
            quiet.append(m.key.split(".", 1)[1])
            continue
        rows.append(m)
    return rows, quiet


def _wrap(line: str) -> list[str]:
    """A header line broken between words to :data:`_HEADER_WIDTH` characters."""
    out: list[str] = []
    for word in line.split():
        if out and len(out[-1]) + 1 + len(word) <= _HEADER_WIDTH:
            out[-1] += " " + word
        else:
            out.append(word)
    return out or [line]


def _group_columns(c: Comparison, i: int, rows: list[MetricRow]) -> list[tuple[str, list[str]]]:
    """A group's columns as (header lines joined later, cells): its values, and against the
    baseline when there is one and it is another group.
    """
    g = c.groups[i]
    header = [w for line in g.own for w in _wrap(line)] + (["(baseline)"] if i == c.baseline
                                                             else [])
    cols = [("\n".join(header), [_cell(g.values[m.key], m.unit)
                                 + (ESTIMATE if g.projected and m.key in ESTIMATED else "")
                                 for m in rows])]
    if c.baseline is not None and i != c.baseline:
        cols.append(("vs baseline", [versus_cell(c, g, m) for m in rows]))
    return cols


def metric_grids(c: Comparison, newline: str, tablefmt: str) -> list[str]:
    """The metric table, split into tables of at most :data:`MAX_WIDTH` characters: a column
    per group, each followed by one against the baseline. A group joins the current table when
    the table, rendered with it, stays within the width (one group alone may exceed it).
    """
    rows, _ = shown_rows(c)
    names = [row_label(m) for m in rows]

    def render(cols: list[tuple[str, list[str]]], fmt: str, line_break: str) -> str:
        headers = ["metric"] + [h.replace("\n", line_break) for h, _ in cols]
        table = [[name, *(cells[r] for _, cells in cols)] for r, name in enumerate(names)]
        return safe_table(table, headers=headers, tablefmt=fmt, disable_numparse=True,
                          colalign=("left",) + ("right",) * len(cols))

    def width(cols: list[tuple[str, list[str]]]) -> int:
        """Characters the table takes as plain text (HTML markup is not what a reader sees)."""
        return max(len(line) for line in render(cols, "simple", "\n").splitlines())

    chunks: list[list[tuple[str, list[str]]]] = [[]]
    for i in range(len(c.groups)):
        cols = _group_columns(c, i, rows)
        if chunks[-1] and width(chunks[-1] + cols) > MAX_WIDTH:
            chunks.append([])
        chunks[-1] += cols
    return [render(cols, tablefmt, newline) for cols in chunks]


def table_notes(c: Comparison) -> list[str]:
    """Lines that go under the metric tables: what all groups share, the rows left out."""
    notes = []
    if c.shared:
        notes.append(f"all configurations: {shared_phrase(c.shared)}")
    _, quiet = shown_rows(c)
    if quiet:
        notes.append("throttle reasons 0 or not measured in every configuration (rows left "
                     f"out): {', '.join(quiet)}")
    return notes


def metric_grid(c: Comparison, newline: str, tablefmt: str) -> str:
    """All of :func:`metric_grids`, one table after another."""
    return "\n\n".join(metric_grids(c, newline, tablefmt))


def _bundle_list(g: Group) -> str:
    ids = [b.path.name for b in g.bundles]
    more = f" and {len(ids) - _LISTED} more" if len(ids) > _LISTED else ""
    return ", ".join(ids[:_LISTED]) + more


def check_lines(checks: list[Check]) -> list[str]:
    """One line per check, ``[kind] message``, or one line saying there is nothing to flag."""
    if not checks:
        return ["none: same workload, platform, precision, batch, sequence length, execution "
                "mode, telemetry sources and schema; every run ended ok"]
    return list(dict.fromkeys(f"[{c.kind}] {terminal_safe(c.message)}" for c in checks))


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
    notes = "\n".join(table_notes(c))
    heading = "**{}**" if markdown else "{}:"
    extra = side_by_side_text(c.bundles, "github" if markdown else "simple")
    slow = [f"{bullet}{b.path.name}: {straggler_line(b.metrics.stragglers)}"
            for b in c.bundles if b.metrics.stragglers]
    from kit.analysis.ranking import ranking_notes, ranking_text

    ranking = ranking_text(c, "github" if markdown else "simple")
    ranked = "\n".join(ranking_notes(c))
    return "\n\n".join([title, heading.format("ranking") + "\n" + ranking, ranked,
                        heading.format("all metrics") + "\n" + grid, *([notes] if notes else []),
                        heading.format("groups") + "\n" + "\n".join(groups),
                        heading.format("comparability") + "\n" + "\n".join(checks),
                        *([heading.format("stragglers") + "\n" + "\n".join(slow)] if slow else []),
                        *([extra] if extra else [])]) + "\n"


def _pct(ratio: float | None) -> float | None:
    return None if ratio is None else (ratio - 1) * 100


def _versus(c: Comparison, g: Group, row: MetricRow) -> tuple[float | None, float | None,
                                                             float | None]:
    """(ratio, percent difference, difference) to the baseline; ratios only for ratio rows."""
    ratio = c.ratio(g, row.key) if row.versus == "ratio" else None
    return ratio, _pct(ratio), c.difference(g, row.key)


def comparison_dict(c: Comparison) -> dict[str, Any]:
    """The comparison as plain JSON data (``null`` where not measured)."""
    groups = []
    for g in c.groups:
        m = g.first
        groups.append({
            "label": g.label, "short_label": g.short, "workload": m.workload["name"],
            "platform": m.platform["name"], "engine": m.config.get("engine", "megatron"),
            "layout": layout_label(m.config), "dtype": m.config["dtype"], "status": g.status,
            "verified": g.verified, "projected": g.projected,
            "bundles": [str(b.path) for b in g.bundles],
            **({"inputs": [i.model_dump() for i in g.bundles[0].projection.inputs]}
               if projection_of(g.bundles[0]) else {}),
            "metrics": {row.key: {**vars(g.values[row.key]),
                                  **dict(zip(("ratio_to_baseline", "pct_diff_to_baseline",
                                              "diff_to_baseline"), _versus(c, g, row),
                                             strict=True))}
                        for row in METRICS},
        })
    return {
        "baseline": c.groups[c.baseline].label if c.baseline is not None else None,
        "shared": c.shared,
        "metrics": [vars(row) for row in METRICS],
        "groups": groups,
        "checks": [vars(check) for check in c.checks],
        "stragglers": {b.path.name: b.metrics.stragglers for b in c.bundles},
        **side_by_side_dict(c.bundles),
    }


def finite(value: Any) -> Any:
    """JSON data with every NaN or infinite float (a ratio of extreme values) as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def _csv(c: Comparison) -> str:
    """Long form: one line per metric per group."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["metric", "label", "unit", "group", "status", "verified", "runs", "n",
                     "median", "min", "max", "ratio_to_baseline", "pct_diff_to_baseline",
                     "diff_to_baseline"])
    for g in c.groups:
        for row in METRICS:
            agg = g.values[row.key]
            writer.writerow([row.key, row.label, row.unit, csv_safe(g.label), g.status,
                             str(g.verified).lower(), len(g.bundles),
                             agg.n, *(NA if v is None else repr(v)
                                      for v in (agg.median, agg.min, agg.max,
                                                *_versus(c, g, row)))])
    return out.getvalue()


def render_comparison(c: Comparison, fmt: Format) -> tuple[str, str]:
    """The comparison in ``fmt``, as (stdout text, stderr text).

    stderr carries the comparability checks for CSV only (the other formats include them).
    """
    if fmt == "json":  # strict JSON: a value beyond a float's range is null, not Infinity
        return json.dumps(finite(comparison_dict(c)), indent=2, allow_nan=False) + "\n", ""
    if fmt == "csv":
        checks = "".join(f"comparability: {line}\n" for line in check_lines(c.checks))
        return _csv(c), terminal_safe(checks, keep_lines=True)
    if fmt == "markdown":
        return markdown_safe(_text(c, markdown=True)), ""
    return terminal_safe(_text(c, markdown=False), keep_lines=True), ""
