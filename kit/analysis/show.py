"""A short human summary of one bundle, for ``charllm-kit bundle show`` and after a run.

``bundle show`` of a sweep folder says it is one and lists its points' bundles, rather than
refusing it for a missing ``manifest.json``.
"""

from typing import Any

from kit.analysis.host import host_figures
from kit.analysis.side_by_side import side_by_side_text
from kit.bundle.reader import Bundle
from kit.bundle.schema import SUMMARY_KEYS
from kit.neutralize import safe_table, terminal_safe
from kit.sweep.folder import SweepFolder

_FRACTIONS = frozenset({"mfu", "clock_sm_frac_of_max", "throttle_frac"})
_LAYOUT = ("tp", "pp", "dp", "cp", "ep")
_PHASES = ("forward_s", "backward_s", "pipeline_p2p_s", "grad_sync_s", "optimizer_s")
_GIB = 2**30
_LABELS = {"step_time_s": "step_time_s (median step)"}
"""Summary keys shown with what they are, where a mean beside them could be mistaken for them."""


def _value(key: str, value: float | int | None) -> str:
    """Format one summary value: n/a for null, percent for fractions, 4 significant digits."""
    if value is None:
        return "n/a"
    if key in _FRACTIONS:
        return f"{value * 100:.1f} %"
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _workload(workload: dict[str, Any]) -> str:
    """Name the workload and, when a platform rule scaled it, from what and how."""
    scaling = workload.get("scaling")
    if not scaling:
        return workload["name"]
    rule = scaling.get("rule", {})
    changes = ", ".join(f"{k}={v}" for k, v in rule.get("set", {}).items())
    return (
        f"{workload['name']} (scaled from {scaling.get('original', {}).get('name', '?')} by "
        f"the {scaling.get('platform', '?')} rule: {changes}; {rule.get('reason', '')})"
    )


def _layout(config: dict[str, Any]) -> str:
    """Parallel degrees from the resolved config, e.g. ``tp2 pp4 dp4 cp1 ep1``."""
    parallel = config.get("parallel") or {}
    return " ".join(f"{k}{parallel.get(k, '?')}" for k in _LAYOUT) if parallel else "n/a"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _stage_table(per_rank: list[dict[str, Any]]) -> str | None:
    """Per pipeline stage: ranks, mean seconds per phase and peak memory.

    None for one stage with no phase times: a stage split would add nothing.
    """
    stages = sorted({r.get("stage", 0) for r in per_rank})
    timed = any(r.get("phase_time_s") for r in per_rank)
    if len(stages) < 2 and not timed:
        return None
    rows = []
    for stage in stages:
        ranks = [r for r in per_rank if r.get("stage", 0) == stage]
        phases = [r["phase_time_s"] for r in ranks if r.get("phase_time_s")]
        peaks = [r["mem_peak_bytes"] for r in ranks if r.get("mem_peak_bytes") is not None]
        rows.append([
            stage, len(ranks),
            *(_value(k, _mean([p[k] for p in phases if p.get(k) is not None])) for k in _PHASES),
            _value("mem", max(peaks) / _GIB if peaks else None),
        ])
    table = safe_table(
        rows, headers=("stage", "ranks", *(k.removesuffix("_s") for k in _PHASES), "peak GiB"),
        disable_numparse=True, colalign=("right",) * (len(_PHASES) + 3),
    )
    note = ("mean seconds per measured step over the steps, a slow one counted in full, and "
            "over the stage's ranks; step_time_s above is the median step")
    if not timed:
        note += "; phases not timed (a CUDA-graphed step, or --no-phase-timers)"
    return f"{table}\n({note})"


def format_bundle(bundle: Bundle) -> str:
    """Summarize a bundle: how the run ended, what ran where, and its summary metrics.

    Args:
        bundle: A bundle from :func:`kit.bundle.reader.read_bundle`.

    Returns:
        A few ``key  value`` lines, a blank line, then a metric/value table (the summary's
        keys, then the host's CPU and memory figures, kit.analysis.host), with several
        pipeline stages or timed phases a table per stage, and a profiled run's time by
        category and pipeline bubble (or a fabric run's bus bandwidth) as ``compare`` shows it.
    """
    manifest, summary = bundle.manifest, bundle.metrics.summary
    rows = [("bundle", bundle.path.name), ("status", manifest.status)]
    if manifest.error is not None:
        rows.append(("error", manifest.error))
    rows += [
        ("workload", _workload(manifest.workload)),
        ("platform", manifest.platform["name"]),
        ("layout", _layout(manifest.config)),
        ("world size", _value("world_size", summary["world_size"])),
    ]
    metrics = [(_LABELS.get(key, key), _value(key, summary[key])) for key in SUMMARY_KEYS]
    metrics += [(f"host_{key}", _value(key, value))  # telemetry's host rows (a CPU host: all
                for key, value in host_figures(bundle).items()]  # there is besides the steps)
    shown = [(key, terminal_safe(str(value))) for key, value in rows]  # a bundle's own words
    parts = [
        safe_table(shown, tablefmt="plain", disable_numparse=True),
        safe_table(metrics, headers=("metric", "value"), colalign=("left", "right"),
                   disable_numparse=True),
    ]
    stages = _stage_table(bundle.metrics.per_rank)
    profile = side_by_side_text([bundle])  # a profiled run's breakdown and bubble, a fabric
    return "\n\n".join(p for p in (*parts, stages, profile) if p)  # run's bus bandwidth


def format_sweep_folder(sweep: SweepFolder) -> str:
    """Say that ``sweep`` is a sweep folder, what to do with it, and list its points."""
    rows = [(p.id, p.status, str(sweep.path / p.bundle) if p.bundle else p.reason or "")
            for p in sweep.index.points]
    return (f"{terminal_safe(sweep.describe())}, not a bundle: `charllm-kit bundle show` one "
            "of its bundles, or give the folder to `compare` or `report`, where it stands for "
            "its bundles.\n\n"
            + safe_table(rows, headers=("point", "status", "bundle (or reason)"),
                         disable_numparse=True))
