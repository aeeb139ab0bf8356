"""Put bundles side by side: group repeats of one configuration, aggregate, relate to a baseline.

Runs are grouped by what was run (workload, platform, engine, nodes, parallel layout,
optimizations, micro and global batch, dtype, execution mode: a graphed and an eager run of one
layout are two configurations, each group's name saying which), by how they ended and by
whether they verified:
a failed, OOM or interrupted run gets its own group, so its partial figures never mix with a
successful repeat's, and so does a bundle that failed verification and is compared only
because of ``--allow-unverified``. Each group reports, per canonical metric, the median,
minimum and maximum over the runs that measured it, and ``n``, how many did; a metric no run
measured is ``None`` (shown as ``n/a``), never 0. Every bundle is verified (each file hashed,
each schema checked) before it is used; the figures come from ``manifest.json`` and
``metrics.json`` alone. A projection file (``charllm-kit project``, kit.projection.file) is read
in place of a bundle: it is a group of its own, marked projected, and its figures' range is the
projection's interval instead of repeats'. A sweep folder given among the bundles stands for
its bundles (:mod:`kit.analysis.inputs`). A bundle given from two folders (one bundle id) is one
run, not two repeats: it is counted once and a ``duplicate`` check says so.

Against a baseline, a metric is related by a ratio where a ratio means something (throughput,
time, energy, power, memory) and by a difference elsewhere: degrees C for temperatures,
percentage points for fractions (MFU, clock, throttled shares), a plain difference for the
peak-to-mean ratio. A baseline that did not end ok is refused: its figures cover a partial run.
"""

import hashlib
import json
import statistics
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from kit.analysis.comparability import Check, comparability_checks, execution_mode
from kit.analysis.figure_render import map_forked
from kit.analysis.host import CPU_UTIL, HOST_MEM, host_figures
from kit.analysis.inputs import expand_inputs
from kit.bundle.reader import Bundle
from kit.bundle.schema import Manifest
from kit.bundle.telemetry_fields import THROTTLE_BITS
from kit.bundle.verified import read_verified_bundle
from kit.config.run_kind import run_kind
from kit.errors import KitInputError
from kit.metrics.labels import configuration_parts, layout_label, split_shared
from kit.neutralize import control_problem, neutral_data, terminal_safe
from kit.projection.file import is_projection_file, projected_bundle, projection_of


@dataclass(frozen=True)
class MetricRow:
    """One canonical metric: where it lives in ``metrics.json`` and how to show it."""

    key: str
    """Stable name: a summary key, or ``power.<key>`` / ``throttle_frac_by_reason.<reason>`` /
    ``stragglers.<key>`` (kit.metrics.stragglers: the rank that held its stage up longest) /
    ``host.<key>`` (kit.analysis.host: from telemetry.parquet's host rows)."""
    label: str
    unit: str
    """Unit of the value; ``fraction`` is 0..1 (tables show it as a percentage)."""
    versus: Literal["ratio", "difference"] = "ratio"
    """How a group relates to the baseline: value / baseline, or value - baseline."""


METRICS: tuple[MetricRow, ...] = (
    MetricRow("tokens_per_s", "throughput", "tokens/s"),
    MetricRow("step_time_s", "step time", "s"),
    MetricRow("tflops_per_gpu", "TFLOP/s per device", "TFLOP/s"),
    MetricRow("mfu", "MFU", "fraction", "difference"),
    MetricRow("energy_j_per_token", "energy per token", "J"),
    MetricRow("power_w_mean", "mean power", "W"),
    MetricRow("power_w_peak", "peak power", "W"),
    MetricRow("power.peak_to_mean", "peak-to-mean power", "ratio", "difference"),
    MetricRow("power.excursions", "power excursions", "count", "difference"),
    MetricRow("power.excursion_s", "excursion time", "s"),
    MetricRow("temp_gpu_c_max", "max temperature", "C", "difference"),
    MetricRow("temp_gpu_c_spread", "temperature spread", "C", "difference"),
    MetricRow("clock_sm_frac_of_max", "SM clock / max", "fraction", "difference"),
    MetricRow("throttle_frac", "throttled, any reason", "fraction", "difference"),
    *(MetricRow(f"throttle_frac_by_reason.{r}", f"throttled, {r}", "fraction", "difference")
      for r in THROTTLE_BITS),
    MetricRow("mem_peak_gib", "peak memory", "GiB"),
    MetricRow(f"host.{CPU_UTIL}", "host CPU busy, mean", "%", "difference"),
    MetricRow(f"host.{HOST_MEM}", "host memory used, peak", "GiB"),
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
    elif key.startswith("host."):  # from telemetry.parquet's host rows (kit.analysis.host)
        value = host_figures(bundle)[key.removeprefix("host.")]
    else:
        value = metrics.summary.get(key)
    return float(value) if isinstance(value, int | float) else None


def _mode(bundle: Bundle) -> str | None:
    """The run's execution mode (kit.analysis.comparability); None for a fabric benchmark,
    which trains no step."""
    return execution_mode(bundle) if run_kind(bundle.manifest.config).trains else None


def _group_key(bundle: Bundle) -> str:
    """What makes two runs repeats of each other (module docstring), as a string."""
    m, c = bundle.manifest, bundle.manifest.config
    return json.dumps(
        [m.workload["name"], m.platform["name"], c["engine"], c["nodes"],
         c["parallel"], c.get("optim"), c["micro_batch_size"], c["global_batch_size"],
         c["dtype"], _mode(bundle), m.status, bundle.verification_error is None,
         str(bundle.path) if projection_of(bundle) else None],
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
    """Unique one-line name of the whole configuration, set once all groups are known."""
    short: str = ""
    """Unique one-line name without the parts all groups share (figures, section titles)."""
    own: list[str] = field(default_factory=list)
    """Header lines without the parts all groups share (empty lines left out)."""
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

    @property
    def projected(self) -> bool:
        """Whether the group is a projection (kit.projection), not measured runs."""
        return projection_of(self.bundles[0]) is not None

    def ending(self) -> str:
        """Runs, with the status when not ok and UNVERIFIED, e.g. ``FAILED (1 run)``."""
        runs = len(self.bundles)
        ending = "PROJECTED" if self.projected else f"{runs} run{'s' if runs > 1 else ''}"
        flags = ([self.status.upper()] if self.status != "ok" else []) + (
            [] if self.verified else ["UNVERIFIED"])
        return f"{' '.join(flags)} ({ending})" if flags else ending

    def parts(self, with_mode: bool) -> list[list[str]]:
        """The configuration as lines of tokens (kit.metrics.labels), the layout line ending
        with the execution mode if ``with_mode`` (where the groups ran in more than one)."""
        parts = configuration_parts(self.first)
        if with_mode and (mode := _mode(self.bundles[0])) is not None:
            parts[-1] = [*parts[-1], mode]
        return parts

    def header(self, with_mode: bool) -> list[str]:
        """Full header lines: workload, platform, engine and layout (:meth:`parts`), runs with
        status."""
        return [" ".join(line) for line in self.parts(with_mode)] + [self.ending()]


@dataclass(frozen=True)
class Comparison:
    """Groups with their aggregates, the baseline group (or None) and comparability checks."""

    groups: list[Group]
    baseline: int | None
    """Index into ``groups`` of the baseline's group."""
    checks: list[Check]
    bundles: list[Bundle]
    """Every compared bundle once, in the order given (an added baseline first)."""
    shared: list[str] = field(default_factory=list)
    """Configuration parts every group shares (left out of headers and short labels)."""

    def ratio(self, group: Group, key: str) -> float | None:
        """Median of ``key`` in ``group`` over the baseline group's; None if either is unknown."""
        if self.baseline is None:
            return None
        base = self.groups[self.baseline].values[key].median
        value = group.values[key].median
        return value / base if value is not None and base else None

    def difference(self, group: Group, key: str) -> float | None:
        """Median of ``key`` in ``group`` minus the baseline group's; None if either is unknown."""
        if self.baseline is None:
            return None
        base = self.groups[self.baseline].values[key].median
        value = group.values[key].median
        return value - base if value is not None and base is not None else None


def figure_order(c: Comparison) -> list[Group]:
    """Groups by workload (first-seen order), fastest first, not-ok runs last."""
    workloads: dict[str, int] = {}
    for g in c.groups:
        workloads.setdefault(g.first.workload["name"], len(workloads))

    def key(g: Group) -> tuple[int, int, float]:
        speed = g.values["tokens_per_s"].median
        return (workloads[g.first.workload["name"]], g.status != "ok",
                -(speed if speed is not None else -1.0))
    return sorted(c.groups, key=key)


def _checksums(bundle: Bundle) -> str | None:
    """The digest of a verified bundle's ``SHA256SUMS`` (its files' identity); None for an
    unverified bundle or a projection."""
    sums = bundle.path / "SHA256SUMS"
    if (bundle.verification_error is not None or projection_of(bundle) is not None
            or not sums.is_file()):
        return None
    return hashlib.sha256(sums.read_bytes()).hexdigest()


def shown_bundle(bundle: Bundle, markdown: bool = False) -> Bundle:
    """``bundle`` as compare and report lay it out: every string of its manifest and metrics
    on one line, its control characters, line breaks and tabs written as escapes (a workload
    name holding a line break would otherwise forge lines of a table or the checks); for a
    Markdown output, its Markdown marks escaped too (:func:`kit.neutralize.markdown_text`).

    Raises:
        KitInputError: The bundle's directory name holds a control character.
    """
    problem = control_problem(bundle.path.name, "the bundle directory's name")
    if problem:
        raise KitInputError(f"bundle {terminal_safe(str(bundle.path))}: {problem}")
    return replace(bundle, manifest=type(bundle.manifest).model_validate(
                       neutral_data(bundle.manifest.model_dump(mode="json"), markdown)),
                   metrics=type(bundle.metrics).model_validate(
                       neutral_data(bundle.metrics.model_dump(mode="json"), markdown)))


def _read_all(paths: list[Path], allow_unverified: bool,
              markdown: bool) -> tuple[list[Bundle], list[Check]]:
    """Verify and read each bundle once, refusing one path given twice; a verified copy of a
    verified bundle already read (the same bundle id in another folder) is counted once, and
    said so in a ``duplicate`` check, since it is the same run and not a repeat."""
    def read(index: int) -> Bundle | KitInputError:
        p = paths[index]
        try:
            return shown_bundle(projected_bundle(p) if is_projection_file(p)
                                else read_verified_bundle(p, allow_unverified), markdown)
        except KitInputError as e:  # raised below, in the order the paths are given
            return e

    read_ahead = map_forked(read, len(paths))  # checksums and decoding: a core per bundle
    bundles, seen = [], set()
    ids: dict[tuple[str, str | None], Path] = {}
    copies: dict[str, list[Path]] = {}
    for p, bundle in zip(paths, read_ahead, strict=True):
        if Path(p).resolve() in seen:
            raise KitInputError(f"bundle {p} is given twice; give each bundle once")
        if isinstance(bundle, KitInputError):
            raise bundle
        where = bundle.path.resolve()
        if where in seen:
            raise KitInputError(f"bundle {p} is given twice; give each bundle once")
        seen.add(where)
        # A copy is the same run only where both verify with the same checksums (then the
        # same files); an unverified one may hold anything, and is shown apart, marked.
        key = (bundle.path.name, _checksums(bundle))
        if key[1] is not None and key in ids:
            copies.setdefault(bundle.path.name, [ids[key]]).append(bundle.path)
            continue
        ids[key] = bundle.path
        bundles.append(bundle)
    checks = [Check("duplicate", f"{name} is given {len(where)} times ("
                    + ", ".join(str(w.parent) for w in where) + "): one run, counted once")
              for name, where in copies.items()]
    return bundles, checks


def _find_baseline(bundles: list[Bundle], baseline: str | Path,
                   allow_unverified: bool, markdown: bool) -> Bundle:
    """The compared bundle that ``baseline`` names (path or bundle id), else read it anew.

    Raises:
        KitInputError: It names nothing, or a run that did not end ok.
    """
    found = next((b for b in bundles if str(baseline) == b.path.name
                  or Path(baseline).resolve() == b.path.resolve()), None)
    if found is None and not Path(baseline).is_dir():
        raise KitInputError(
            f"unknown baseline {baseline}: give one of the compared bundles (its path or id) "
            "or another bundle directory"
        )
    base = found or shown_bundle(read_verified_bundle(baseline, allow_unverified), markdown)
    if base.manifest.status != "ok":
        raise KitInputError(
            f"baseline {base.path.name} ended {base.manifest.status}: its figures cover a "
            "partial run, so nothing can be related to them; choose a bundle that ended ok"
        )
    return base


def _label(groups: list[Group]) -> list[str]:
    """Give every group its header lines and unique labels; return the shared parts."""
    with_mode = len({_mode(g.bundles[0]) for g in groups} - {None}) > 1
    split = split_shared([g.parts(with_mode) for g in groups])
    counts: dict[str, int] = {}
    shorts: dict[str, int] = {}
    for g, own in zip(groups, split.own, strict=True):
        flags = ("" if g.status == "ok" else f" [{g.status}]") + (
            "" if g.verified else " [unverified]") + (" [projected]" if g.projected else "")
        base = " ".join(g.header(with_mode)[:3]) + flags
        counts[base] = counts.get(base, 0) + 1
        g.label = base if counts[base] == 1 else f"{base} #{counts[base]}"
        g.own = [" ".join(line) for line in own if line] + [g.ending()]
        # a repeat that differs only in how it ended keeps its layout in its name
        short = (" ".join(t for line in own for t in line) or layout_label(g.first.config)) + flags
        shorts[short] = shorts.get(short, 0) + 1
        g.short = short if shorts[short] == 1 else f"{short} #{shorts[short]}"
    return split.shared


def _baseline_checks(groups: list[Group], index: int | None) -> list[Check]:
    """A baseline of one workload related to groups of others: their ratios compare different
    models, so the table says so (workloads are otherwise compared only among themselves)."""
    if index is None:
        return []
    base = groups[index].first.workload["name"]
    others = sorted({g.first.workload["name"] for g in groups} - {base})
    if not others:
        return []
    return [Check("baseline", f"the baseline is {base}; ratios to it for {', '.join(others)} "
                              "compare different workloads, not only configurations")]


def compare_bundles(paths: list[str | Path], baseline: str | Path | None = None,
                    allow_unverified: bool = False, markdown: bool = False,
                    swept: Collection[str] | None = None) -> Comparison:
    """Verify, read, group and aggregate bundles, and check what makes them hard to compare.

    Args:
        paths: Bundle directories or sweep folders (each standing for its bundles); groups
            keep the order of their first bundle.
        baseline: A bundle (path, or id of one in ``paths``) whose group the other groups are
            related to; a bundle not in ``paths`` is added first. It must have ended ok.
        allow_unverified: Use bundles that fail verification (in groups of their own, flagged
            by an ``unverified`` check) instead of refusing them.
        markdown: The comparison goes into Markdown: the bundles' strings have their Markdown
            marks escaped (:func:`shown_bundle`).
        swept: The axes the bundles vary on purpose (a study's factors), said as such instead
            of flagged (:func:`~kit.analysis.comparability.comparability_checks`); None: those
            of their sweep when all of them came from one sweep folder, else none.

    Raises:
        KitInputError: No bundles, a bundle given twice, an unknown or failed baseline, a
            sweep folder without bundles, or a path that is not a readable, verified bundle
            (:class:`kit.errors.BundleError`).
    """
    if not paths:
        raise KitInputError("no bundles to compare: give one or more bundle directories")
    inputs = expand_inputs(paths)
    bundles, duplicates = _read_all(inputs.bundles, allow_unverified, markdown)
    base = (_find_baseline(bundles, baseline, allow_unverified, markdown)
            if baseline is not None else None)
    if base is not None and all(base is not b for b in bundles):
        bundles.insert(0, base)
    by_key: dict[str, Group] = {}
    for b in bundles:
        by_key.setdefault(_group_key(b), Group([])).bundles.append(b)
    groups = list(by_key.values())
    for g in groups:
        g.values = {row.key: Aggregate.of([metric_value(b, row.key) for b in g.bundles])
                    for row in METRICS}
        if g.projected:  # the projection's interval stands where repeats' range would
            interval = g.bundles[0].projection.interval  # type: ignore[union-attr]
            g.values.update({k: Aggregate(v[1], v[0], v[2], 1) for k, v in interval.items()
                             if k in g.values})
    shared = _label(groups)
    index = (next(i for i, g in enumerate(groups) if any(b is base for b in g.bundles))
             if base is not None else None)
    checks = ([Check("sweep", note) for note in inputs.notes] + duplicates
              + comparability_checks(bundles, inputs.swept if swept is None else swept)
              + _baseline_checks(groups, index))
    return Comparison(groups, index, checks, bundles, shared)
