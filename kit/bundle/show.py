"""A short human summary of one bundle, for ``charllm-kit bundle show`` and after a run."""

from typing import Any

from tabulate import tabulate

from kit.bundle.reader import Bundle
from kit.bundle.schema import SUMMARY_KEYS

_FRACTIONS = frozenset({"mfu", "clock_sm_frac_of_max", "throttle_frac"})
_LAYOUT = ("tp", "pp", "dp", "cp", "ep")


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


def format_bundle(bundle: Bundle) -> str:
    """Summarize a bundle: how the run ended, what ran where, and its summary metrics.

    Args:
        bundle: A bundle from :func:`kit.bundle.reader.read_bundle`.

    Returns:
        A few ``key  value`` lines, a blank line, then a metric/value table.
    """
    manifest, summary = bundle.manifest, bundle.metrics["summary"]
    rows = [("bundle", bundle.path.name), ("status", manifest["status"])]
    if manifest["error"] is not None:
        rows.append(("error", manifest["error"]))
    rows += [
        ("workload", _workload(manifest["workload"])),
        ("platform", manifest["platform"]["name"]),
        ("layout", _layout(manifest["config"])),
        ("world size", _value("world_size", summary["world_size"])),
    ]
    metrics = [(key, _value(key, summary[key])) for key in SUMMARY_KEYS]
    return "\n\n".join(
        [
            tabulate(rows, tablefmt="plain", disable_numparse=True),
            tabulate(
                metrics,
                headers=("metric", "value"),
                colalign=("left", "right"),
                disable_numparse=True,
            ),
        ]
    )
