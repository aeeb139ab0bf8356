"""One ranking table: a row per configuration, fastest first within its workload.

The table ``compare`` and ``report`` open with. Rows are the comparison's groups
(:class:`~kit.analysis.compare.Group`: repeats of one configuration, a copied bundle counted
once), ranked by median throughput within their workload; workloads keep the order they were
first given and are never ranked against each other. A cell is the median over repeats with
``[min..max]`` when they differ. Every column says whether it is a per-GPU figure or one of all
the job's GPUs together, and the peak-power columns sit beside the sample counts and window
they rest on (``docs/metrics.md``): a peak or peak-to-mean over a window shorter than the
minimum for meaningful peaks is marked ``*``, an energy cross-check above
:data:`ENERGY_CHECK_LIMIT` is marked ``!``.
"""

import html
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from kit.analysis.comparability import power_source
from kit.analysis.compare import Aggregate, Comparison, Group, figure_order, metric_value
from kit.bundle.reader import Bundle
from kit.errors import BundleError
from kit.metrics.text import NA, format_value
from kit.neutralize import safe_table
from kit.projection.file import projection_of

ENERGY_CHECK_LIMIT = 0.02
"""Largest disagreement between the energy counter, the power integral and Zeus shown
unflagged (DESIGN.md: a disagreement above 2% is shown)."""


@dataclass(frozen=True)
class Column:
    """One column: its header (with scope and unit) and how a bundle gives its value."""

    key: str
    header: str
    unit: str
    """``fraction`` values show as percent; ``count`` as integers."""


COLUMNS: tuple[Column, ...] = (
    Column("tokens_per_s", "throughput\nall GPUs\ntokens/s", ""),
    Column("step_time_s", "step\ntime\ns", ""),
    Column("tflops_per_gpu", "TFLOP/s\nper GPU", ""),
    Column("mfu", "MFU\nper GPU", "fraction"),
    Column("energy_j_per_token", "energy/token\nall GPUs\nJ", ""),
    Column("power_w_mean", "mean power\nper GPU\nW", ""),
    Column("power_w_peak", "peak power\nper GPU\nW", ""),
    Column("power.peak_to_mean", "peak-to-\nmean\nworst GPU", ""),
    Column("power.excursions", "excur-\nsions\nall GPUs", "count"),
    Column("power.excursion_s", "excursion\ntime\nall GPUs s", ""),
    Column("samples", "power\nsamples\nper GPU", "count"),
    Column("window_s", "measured\nwindow\ns", ""),
    Column("temp_gpu_c_max", "max\ntemp.\n°C", ""),
    Column("temp_gpu_c_spread", "temp.\nspread\n°C", ""),
    Column("clock_sm_frac_of_max", "SM clock\n/ max\nper GPU", "fraction"),
    Column("throttle_frac", "throttled\nshare\nall GPUs", "fraction"),
    Column("mem_peak_gib", "peak mem.\nper GPU\nGiB", ""),
    Column("energy_check", "energy\ncross-\ncheck", "fraction"),
)
"""The ranking's value columns, in order (after rank, configuration and runs)."""


def _known(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def power_samples(bundle: Bundle) -> float | None:
    """Fewest power samples of any GPU over the measured steps."""
    power = bundle.metrics.power
    found = _known(power.get("power_samples_min"))
    if found is not None:
        return found
    counts = [_known(d.get("power_samples", d.get("samples"))) for d in bundle.metrics.per_device]
    counts = [c for c in counts if c is not None]
    return min(counts) if counts else None


def window_s(bundle: Bundle) -> float | None:
    """Seconds of the measured phase: ``power.window_s``, else the measured steps' span."""
    found = _known(bundle.metrics.power.get("window_s"))
    if found is not None or projection_of(bundle) is not None:  # a projection has no steps
        return found
    try:
        steps = bundle.steps
    except BundleError:  # an unverified bundle's unreadable steps: nothing to show
        return None
    if steps.num_rows == 0 or "phase" not in steps.column_names:
        return None
    measured = steps.filter(pc.equal(steps["phase"], "measured"))
    if measured.num_rows == 0:
        return None
    return float(pc.max(measured["t_end"]).as_py() - pc.min(measured["t_start"]).as_py())


def energy_check(bundle: Bundle) -> float | None:
    """Largest |disagreement| among the energy counter, the power integral and Zeus."""
    power = bundle.metrics.power
    found = _known(power.get("energy_check_max"))
    if found is not None:
        return found
    parts = [_known(power.get(k)) for k in ("counter_vs_integral", "zeus_vs_counter")]
    parts = [abs(p) for p in parts if p is not None]
    return max(parts) if parts else None


def window_short(bundle: Bundle) -> bool:
    """Whether the run's window held fewer samples than the minimum for meaningful peaks."""
    return bundle.metrics.power.get("window_short") is True


def instantaneous(bundle: Bundle) -> bool | None:
    """Whether peak power comes from instantaneous samples (``power_w``); None: no power."""
    field = bundle.metrics.power.get("power_field")
    if field is None:  # bundles written before metrics.json named it: the telemetry source
        source = power_source(bundle) or ""
        field = next((f for f in ("power_w", "power_avg_w") if source.endswith(f" {f}")), None)
    return None if field is None else field == "power_w"


def _value(bundle: Bundle, key: str) -> float | None:
    if key == "samples":
        return power_samples(bundle)
    if key == "window_s":
        return window_s(bundle)
    if key == "energy_check":
        return energy_check(bundle)
    return metric_value(bundle, key)


@dataclass(frozen=True)
class RankRow:
    """One configuration's row."""

    rank: int | None
    """Place within its workload; None for a run that did not end ok (listed last)."""
    workload: str
    group: Group
    values: dict[str, Aggregate]
    short_window: bool
    """Some run's window was too short for meaningful peaks."""
    averaged_peak: bool
    """Some run's peak power comes from averaged power (no instantaneous readings)."""


def ranking_rows(c: Comparison) -> list[RankRow]:
    """The groups ranked by throughput within their workload (:func:`figure_order`)."""
    rows, place = [], {}
    for g in figure_order(c):
        workload = g.first.workload["name"]
        ok = g.status == "ok" and not g.projected
        rank = place.get(workload, 0) + 1 if ok else None
        if ok:
            place[workload] = rank
        values = {col.key: (g.values[col.key] if col.key in g.values else
                            Aggregate.of([_value(b, col.key) for b in g.bundles]))
                  for col in COLUMNS}
        rows.append(RankRow(rank, workload, g, values,
                            any(window_short(b) for b in g.bundles),
                            any(instantaneous(b) is False for b in g.bundles)))
    return rows


def _fmt(value: float | None, unit: str) -> str:
    if unit == "count" and value is not None:
        return f"{value:,.0f}"
    return format_value(value, unit)


def _cell(row: RankRow, col: Column) -> str:
    agg = row.values[col.key]
    if agg.n == 0:
        return NA
    text = _fmt(agg.median, col.unit)
    if agg.min != agg.max:
        text += f" [{_fmt(agg.min, col.unit)}..{_fmt(agg.max, col.unit)}]"
    if col.key in ("power_w_peak", "power.peak_to_mean", "power.excursions") and row.short_window:
        text += " *"
    if col.key == "power_w_peak" and row.averaged_peak:
        text += " (avg)"
    if col.key == "energy_check" and agg.max is not None and agg.max > ENERGY_CHECK_LIMIT:
        text += " !"
    return text


def _versus(c: Comparison, row: RankRow) -> str:
    if c.baseline is None:
        return ""
    if c.groups[c.baseline] is row.group:
        return "baseline"
    ratio = c.ratio(row.group, "tokens_per_s")
    return NA if ratio is None else f"x{ratio:.3f}"


def table_rows(c: Comparison) -> tuple[list[str], list[list[str]], list[str]]:
    """Headers, cells and the workload of each row (for grouping)."""
    rows = ranking_rows(c)
    headers = ["#", "configuration", "runs", *(col.header for col in COLUMNS[:1])]
    headers += ["throughput\nvs\nbaseline"] if c.baseline is not None else []
    headers += [col.header for col in COLUMNS[1:]]
    cells = []
    for r in rows:
        values = [_cell(r, col) for col in COLUMNS]
        cells.append([str(r.rank) if r.rank else "-", r.group.short, r.group.ending(), values[0],
                      *([_versus(c, r)] if c.baseline is not None else []), *values[1:]])
    return headers, cells, [r.workload for r in rows]


def ranking_notes(c: Comparison) -> list[str]:
    """What the marks in the ranking mean, said once under it (only marks that occur)."""
    rows = ranking_rows(c)
    notes = ["Ranked by median throughput within each workload; workloads are not ranked "
             "against each other. Cells: median [min..max] over repeats; per GPU = one GPU's "
             "figure (peak, max and peak-to-mean: the worst GPU), all GPUs = the job's GPUs "
             "together. Power samples per GPU: the fewest any GPU had in the measured window; "
             "energy cross-check: the largest disagreement among the energy counter, the power "
             "integral and Zeus."]
    if any(r.short_window for r in rows):
        notes.append("* the measured window held fewer power samples than the minimum for "
                     "meaningful peaks (docs/metrics.md): peak, peak-to-mean and excursions "
                     "rest on too few samples.")
    if any(r.averaged_peak for r in rows):
        notes.append("(avg): peak power of the driver's averaged power (no instantaneous "
                     "readings), which smooths the peaks; elsewhere peak power is instantaneous "
                     "(power_w samples).")
    elif any(instantaneous(b) for b in c.bundles):
        notes.append("Peak power is instantaneous: the highest power_w sample.")
    if any((r.values["energy_check"].max or 0) > ENERGY_CHECK_LIMIT for r in rows):
        notes.append(f"! energy counter, power integral and Zeus disagree by more than "
                     f"{ENERGY_CHECK_LIMIT:.0%}: energy per token is uncertain by as much.")
    return notes


def ranking_text(c: Comparison, tablefmt: str = "simple") -> str:
    """The ranking as one text table (a workload column when there are several)."""
    headers, cells, workloads = table_rows(c)
    if tablefmt != "simple":  # Markdown: a header is one line
        headers = [h.replace("\n", " ") for h in headers]
    if len(set(workloads)) > 1:
        headers = ["workload", *headers]
        cells = [[w, *row] for w, row in zip(workloads, cells, strict=True)]
    return safe_table(cells, headers=headers, tablefmt=tablefmt, disable_numparse=True)


def ranking_html(c: Comparison) -> str:
    """The ranking as one HTML table in a horizontally scrolling box, a heading row per
    workload."""
    headers, cells, workloads = table_rows(c)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body, current = [], None
    for workload, row in zip(workloads, cells, strict=True):
        if workload != current:
            current = workload
            body.append(f'<tr class="workload"><th colspan="{len(headers)}">'
                        f"{html.escape(workload)}</th></tr>")
        body.append("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>")
    notes = "".join(f'<p class="sub">{html.escape(n)}</p>' for n in ranking_notes(c))
    return (f'<div class="scroll"><table class="ranking"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>{notes}")

