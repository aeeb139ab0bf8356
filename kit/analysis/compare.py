"""Put bundles side by side: group repeats of one configuration, aggregate, relate to a baseline.

Runs are grouped by what was run (workload, platform, engine, nodes, parallel layout,
optimizations, micro and global batch, dtype), by how they ended and by whether they verified:
a failed, OOM or interrupted run gets its own group, so its partial figures never mix with a
successful repeat's, and so does a bundle that failed verification and is compared only
because of ``--allow-unverified``. Each group reports, per canonical metric, the median,
minimum and maximum over the runs that measured it, and ``n``, how many did; a metric no run
measured is ``None`` (shown as ``n/a``), never 0. Every bundle is verified (each file hashed,
each schema checked) before it is used; the figures come from ``manifest.json`` and
``metrics.json`` alone.
"""

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.analysis.comparability import Check, comparability_checks
from kit.bundle.reader import Bundle
from kit.bundle.schema import Manifest
from kit.bundle.verified import read_verified_bundle
from kit.errors import KitInputError
from kit.telemetry.fields import THROTTLE_BITS


@dataclass(frozen=True)
class MetricRow:
    """One canonical metric: where it lives in ``metrics.json`` and how to show it."""

    key: str
    """Stable name: a summary key, or ``power.<key>`` / ``throttle_frac_by_reason.<reason>`` /
    ``stragglers.<key>`` (kit.analysis.stragglers: the rank that held its stage up longest)."""
    label: str
    unit: str
    """Unit of the value; ``fraction`` is 0..1 (tables show it as a percentage)."""


METRICS: tuple[MetricRow, ...] = (
    MetricRow("tokens_per_s", "throughput", "tokens/s"),
    MetricRow("step_time_s", "step time", "s"),
    MetricRow("tflops_per_gpu", "TFLOP/s per device", "TFLOP/s"),
    MetricRow("mfu", "MFU", "fraction"),
    MetricRow("energy_j_per_token", "energy per token", "J"),
    MetricRow("power_w_mean", "mean power", "W"),
    MetricRow("power_w_peak", "peak power", "W"),
    MetricRow("power.peak_to_mean", "peak-to-mean power", "ratio"),
    MetricRow("temp_gpu_c_max", "max temperature", "C"),
    MetricRow("temp_gpu_c_spread", "temperature spread", "C"),
    MetricRow("clock_sm_frac_of_max", "SM clock / max", "fraction"),
    MetricRow("throttle_frac", "throttled, any reason", "fraction"),
    *(MetricRow(f"throttle_frac_by_reason.{r}", f"throttled, {r}", "fraction")
      for r in THROTTLE_BITS),
    MetricRow("mem_peak_gib", "peak memory", "GiB"),
    MetricRow("stragglers.slowest_frac", "slowest rank: share of steps", "fraction"),
    MetricRow("stragglers.lag_s_median", "median straggler lag", "s"),
    MetricRow("stragglers.lag_frac_median", "straggler lag / others' compute", "fraction"),
)
"""The rows of every comparison, in order."""


def metric_value(bundle: Bundle, key: str) -> float | None:
    """One metric of a bundle by its :class:`MetricRow` key; None when not recorded."""
    metrics = bundle.metrics
    if key.startswith("power."):
        value = metrics.power.get(key.removeprefix("power."))
    elif key.startswith("throttle_frac_by_reason."):
        by_reason = metrics.power.get("throttle_frac_by_reason") or {}
        value = by_reason.get(key.split(".", 1)[1])
    elif key.startswith("stragglers."):
        value = metrics.stragglers.get(key.removeprefix("stragglers."))
    else:
        value = metrics.summary.get(key)
    return float(value) if isinstance(value, int | float) else None


def layout_label(config: dict[str, Any]) -> str:
    """The parallel layout and batch of a resolved config, e.g. ``tp2 pp1 dp4 ep2 mb1 gb128``."""
    p = config["parallel"]
    parts = [f"tp{p['tp']}", f"pp{p['pp']}", f"dp{p['dp']}"]
    parts += [f"{k}{p[k]}" for k in ("cp", "ep") if p.get(k, 1) != 1]
    parts += [f"vpp{p['vpp']}"] if p.get("vpp") else []
    parts += ["sp"] if p.get("sp") else []
    optim = config.get("optim") or {}
    parts += [f"recompute={optim['recompute']}"] if optim.get("recompute", "none") != "none" else []
    parts += [k for k in ("overlap", "dist_optimizer", "fsdp") if optim.get(k)]
    parts += [f"zero{optim['zero']}"] if optim.get("zero") else []
    parts += [f"mb{config['micro_batch_size']}", f"gb{config['global_batch_size']}"]
    return " ".join(parts)


def _group_key(bundle: Bundle) -> str:
    """What makes two runs repeats of each other (module docstring), as a string."""
    m, c = bundle.manifest, bundle.manifest.config
    return json.dumps(
        [m.workload["name"], m.platform["name"], c["engine"], c["nodes"],
         c["parallel"], c.get("optim"), c["micro_batch_size"], c["global_batch_size"],
         c["dtype"], m.status, bundle.verification_error is None],
        sort_keys=True,
    )


@dataclass(frozen=True)
class Aggregate:
    """One metric over a group's runs: median, min and max of the runs that measured it."""

    median: float | None
    min: float | None
    max: float | None
    n: int
    """Runs that recorded the metric."""

    @classmethod
    def of(cls, values: list[float | None]) -> "Aggregate":
        """Aggregate ``values``, leaving out None."""
        known = [v for v in values if v is not None]
        if not known:
            return cls(None, None, None, 0)
        return cls(statistics.median(known), min(known), max(known), len(known))


@dataclass
class Group:
    """Repeats of one configuration that ended the same way."""

    bundles: list[Bundle]
    label: str = ""
    """Unique one-line name, set once all groups are known."""
    values: dict[str, Aggregate] = field(default_factory=dict)

    @property
    def first(self) -> Manifest:
        """The first run's manifest (all runs of a group share its configuration)."""
        return self.bundles[0].manifest

    @property
    def status(self) -> str:
        """``ok``, or the shared status of the group's runs that did not end ok."""
        return self.first.status

    @property
    def verified(self) -> bool:
        """Whether the group's runs verified (False: used through ``--allow-unverified``)."""
        return self.bundles[0].verification_error is None

    def header(self) -> list[str]:
        """Column header lines: workload, platform, layout, runs with status and UNVERIFIED."""
        m = self.first
        runs = len(self.bundles)
        ending = f"{runs} run{'s' if runs > 1 else ''}"
        flags = ([self.status.upper()] if self.status != "ok" else []) + (
            [] if self.verified else ["UNVERIFIED"])
        if flags:
            ending = f"{' '.join(flags)} ({ending})"
        return [m.workload["name"],
                f"{m.platform['name']} x{len(m.ranks)} {m.config['dtype']}",
                layout_label(m.config), ending]


@dataclass(frozen=True)
class Comparison:
    """Groups with their aggregates, the baseline group (or None) and comparability checks."""

    groups: list[Group]
    baseline: int | None
    """Index into ``groups`` of the baseline's group."""
    checks: list[Check]
    bundles: list[Bundle]
    """Every compared bundle once, in the order given (an added baseline first)."""

    def ratio(self, group: Group, key: str) -> float | None:
        """Median of ``key`` in ``group`` over the baseline group's; None if either is unknown."""
        if self.baseline is None:
            return None
        base = self.groups[self.baseline].values[key].median
        value = group.values[key].median
        return value / base if value is not None and base else None


def _read_all(paths: list[str | Path], allow_unverified: bool) -> list[Bundle]:
    """Verify and read each bundle once, refusing one given twice."""
    bundles, seen = [], set()
    for p in paths:
        bundle = read_verified_bundle(p, allow_unverified)
        where = bundle.path.resolve()
        if where in seen:
            raise KitInputError(f"bundle {p} is given twice; give each bundle once")
        seen.add(where)
        bundles.append(bundle)
    return bundles


def _find_baseline(bundles: list[Bundle], baseline: str | Path,
                   allow_unverified: bool) -> Bundle:
    """The compared bundle that ``baseline`` names (path or bundle id), else read it anew."""
    for b in bundles:
        if str(baseline) == b.path.name or Path(baseline).resolve() == b.path.resolve():
            return b
    if not Path(baseline).is_dir():
        raise KitInputError(
            f"unknown baseline {baseline}: give one of the compared bundles (its path or id) "
            "or another bundle directory"
        )
    return read_verified_bundle(baseline, allow_unverified)


def _label(groups: list[Group]) -> None:
    """Give every group a unique one-line label (``#2``, ``#3`` for look-alikes)."""
    counts: dict[str, int] = {}
    for g in groups:
        base = (" ".join(g.header()[:3]) + ("" if g.status == "ok" else f" [{g.status}]")
                + ("" if g.verified else " [unverified]"))
        counts[base] = counts.get(base, 0) + 1
        g.label = base if counts[base] == 1 else f"{base} #{counts[base]}"


def compare_bundles(paths: list[str | Path], baseline: str | Path | None = None,
                    allow_unverified: bool = False) -> Comparison:
    """Verify, read, group and aggregate bundles, and check what makes them hard to compare.

    Args:
        paths: Bundle directories; groups keep the order of their first bundle.
        baseline: A bundle (path, or id of one in ``paths``) whose group the ratios are
            against; a bundle not in ``paths`` is added first.
        allow_unverified: Use bundles that fail verification (in groups of their own, flagged
            by an ``unverified`` check) instead of refusing them.

    Raises:
        KitInputError: No bundles, a bundle given twice, an unknown baseline, or a path that
            is not a readable, verified bundle (:class:`kit.errors.BundleError`).
    """
    if not paths:
        raise KitInputError("no bundles to compare: give one or more bundle directories")
    bundles = _read_all(paths, allow_unverified)
    base = (_find_baseline(bundles, baseline, allow_unverified) if baseline is not None
            else None)
    if base is not None and all(base is not b for b in bundles):
        bundles.insert(0, base)
    by_key: dict[str, Group] = {}
    for b in bundles:
        by_key.setdefault(_group_key(b), Group([])).bundles.append(b)
    groups = list(by_key.values())
    for g in groups:
        g.values = {row.key: Aggregate.of([metric_value(b, row.key) for b in g.bundles])
                    for row in METRICS}
    _label(groups)
    index = (next(i for i, g in enumerate(groups) if any(b is base for b in g.bundles))
             if base is not None else None)
    return Comparison(groups, index, comparability_checks(bundles), bundles)
