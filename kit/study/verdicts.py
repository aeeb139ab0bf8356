"""This node's verdict on each finding of the study, from bundles' facts (pure functions).

Each function takes every bundle the study has (:class:`kit.study.facts.BundleFacts`), picks
the runs its finding needs by their settings, and returns a :class:`FindingResult`: the
numbers, a verdict with the reason, the bundles it rests on, and the data of its figure.

Verdicts: ``agrees`` / ``disagrees`` (the numbers are evidence); ``confounded`` (the runs that
would decide it differ in more than the finding's factor: :mod:`kit.study.likeness` names what
and by how much); ``not measurable here`` (the runs, the sensors or the factor itself are
missing: overlap with nothing to overlap, recomputation off in every run). Each finding
declares what it varies and what may differ besides (:data:`HELD`); where bundles allow a
comparison that holds everything else fixed, it is preferred over one that does not. Where a
finding is about one cause and the runs vary a second one with it, the verdict compares runs
that hold the second fixed (the micro-batch count in the burst finding; the layout in the
recomputation and overlap findings; uniform-load layouts in the position finding).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from kit.study.catalog import StudyFinding, finding
from kit.study.facts import BundleFacts
from kit.study.likeness import (
    HOST_BOUND,
    LAYOUT,
    Difference,
    Held,
    alike_groups,
    alike_key,
    describe,
    differences,
)

Verdict = Literal["agrees", "disagrees", "confounded", "not measurable here"]

PEAK_TO_MEAN_RISE = 0.1
"""A rise of the worst GPU's peak-to-mean power ratio that counts as burstier: above the spread
of repeats of one layout (TP4, micro-batch 1 on 4 H200s: 1.14-1.22, issue 38)."""
POWER_CHANGE = 0.03
"""A change of mean power (relative) above run-to-run noise."""
TEMP_CHANGE_C = 2.0
"""A temperature difference above the sensor's 1 deg C resolution and run-to-run drift."""
THROTTLE_SHARE = 0.1
"""A share of samples throttled for temperature that counts as persistent throttling."""
LINK_UNDERUSE = 0.8
"""TP x PP below this fraction of the TP-only layout's link rate counts as under-use."""
SAME_ORDER = 0.5
"""Rank correlation of per-GPU temperatures across layouts that counts as the same order."""
EXPOSED_COMM_DROP = 0.1
"""The share by which a profiled step's exposed communication must fall with overlap on for
the overlap to have hidden anything. A judgement, not a measured spread: the profile times a
few steps, and a smaller fall would not tell a hidden collective from a step-to-step wobble."""

_BY_DESIGN = ("a layout's pipeline bubble and communication keep GPUs waiting by design: how "
              "busy it keeps them is part of what the layouts are")
_TUNED = "each side is its best measured configuration: the study compares tuned setups"

HELD: dict[str, Held] = {
    "scale-up": Held(frozenset({"platform", "nodes", "world_size"}), {
        k: _TUNED for k in (*LAYOUT, "moe_dispatcher", "micro_batch_size", "recompute",
                            "recompute_method", "overlap", "dist_optimizer", "fsdp", "zero",
                            "offload", "execution", "speed_features", "sampling_period",
                            HOST_BOUND)}),
    "tp-pp-links": Held(frozenset({"tp", "pp", "vpp", "sp"}), {HOST_BOUND: _BY_DESIGN}),
    "microbatch-bursts": Held(frozenset({"micro_batch_size", "global_batch_size"})),
    "thermal-position": Held(frozenset(LAYOUT), {HOST_BOUND: _BY_DESIGN}),
    "pp-throttle": Held(frozenset(LAYOUT), {HOST_BOUND: _BY_DESIGN}),
    "recompute-power": Held(frozenset({"recompute", "recompute_method"})),
    "overlap-power": Held(frozenset({"overlap"})),
}
"""Each finding's factor and what else it lets differ (thermal-placement compares nothing)."""


@dataclass(frozen=True)
class Plot:
    """The data of a finding's figure: one line (or bar group) per series.

    Attributes:
        kind: ``line`` or ``bar``.
        x_label: The x axis.
        y_label: The y axis: the quantity the verdict rests on.
        series: Series name -> its (x, y) points.
        samples: Series name -> how many measurements each of its points rests on, in the
            order of its points (power or temperature samples of the GPU the point reads,
            counter readings for link rates, measured steps for throughput; for a pair, the
            fewer of its two runs); None where unknown. Empty when no series has counts.
        y_origin: Where the quantity axis starts: 0, or the value that means "no effect" for
            a ratio (1 for peak-to-mean power); the figure says so when it is not 0.
    """

    kind: Literal["line", "bar"]
    x_label: str
    y_label: str
    series: dict[str, list[tuple[Any, float]]]
    samples: dict[str, list[int | None]] = field(default_factory=dict)
    y_origin: float = 0.0


@dataclass
class FindingResult:
    """One finding: the study's claim, this node's numbers, the verdict and its bundles.

    ``held`` is the finding's comparison (:data:`HELD`; None for one that compares nothing),
    ``differs`` what the compared runs differ in beyond it (a ``confounded`` verdict's why).
    """

    finding: StudyFinding
    verdict: Verdict
    why: str
    evidence: dict[str, Any] = field(default_factory=dict)
    bundles: list[str] = field(default_factory=list)
    plot: Plot | None = None
    held: Held | None = None
    differs: list[Difference] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The ``findings.json`` entry."""
        held = self.held.as_json() if self.held else {"factor": [], "held_fixed": [],
                                                      "may_differ": {}}
        return {"finding": self.finding.id, "title": self.finding.title,
                "study": self.finding.reported, "verdict": self.verdict, "why": self.why,
                **held, "differs": [d.as_json() for d in self.differs],
                "evidence": self.evidence, "bundles": sorted(set(self.bundles))}


def _result(finding_id: str, verdict: Verdict, why: str, evidence: dict[str, Any] | None = None,
            bundles: list[str] | None = None, plot: Plot | None = None,
            differs: list[Difference] | None = None) -> FindingResult:
    return FindingResult(finding(finding_id), verdict, why, evidence or {}, bundles or [], plot,
                         HELD.get(finding_id), differs or [])


def _unmeasurable(finding_id: str, why: str, **evidence: Any) -> FindingResult:
    return _result(finding_id, "not measurable here", why, evidence)


def _beyond(said: str, diffs: list[Difference]) -> str:
    """A confounded verdict's why: what was measured, then what differs besides the factor."""
    return (f"{said}; but the runs differ beyond the factor ({describe(diffs)}), so these "
            "numbers are not evidence on the finding")


def _samples(f: BundleFacts, device: int | None = None) -> int | None:
    """Power samples of a device of ``f`` (the fewest of its devices when None)."""
    counts = f.device_values("samples")
    if device is not None:
        return int(counts[device]) if device in counts else None
    return int(min(counts.values())) if counts else None


def _worst_device(f: BundleFacts, key: str) -> int | None:
    values = f.device_values(key)
    return max(values, key=values.get) if values else None


def _fewest(*counts: int | None) -> int | None:
    known = [c for c in counts if c is not None]
    return min(known) if known else None


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(float(x), digits)


def _runs(facts: list[BundleFacts]) -> list[BundleFacts]:
    return [f for f in facts if f.ok]


def _setting(f: BundleFacts, without: str = "") -> tuple:
    """Everything that makes two runs comparable, less ``without``."""
    items = {"platform": f.platform, "workload": f.workload, "nodes": f.nodes,
             "layout": f.layout, "recompute": f.recompute, "overlap": f.overlap,
             "micro_batch_size": f.micro_batch_size, "global_batch_size": f.global_batch_size}
    items.pop(without, None)
    return tuple(sorted(items.items()))


def _mean(values: dict[int, float]) -> float | None:
    return float(np.mean(list(values.values()))) if values else None


def _rank_corr(a: dict[int, float], b: dict[int, float]) -> float | None:
    """Spearman's rank correlation of two per-device figures over their common devices."""
    common = sorted(set(a) & set(b))
    if len(common) < 3:
        return None
    ra = np.argsort(np.argsort([a[d] for d in common])).astype(float)
    rb = np.argsort(np.argsort([b[d] for d in common])).astype(float)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


# --- scale-up vs scale-out ---------------------------------------------------------------------

def scale_up(facts: list[BundleFacts]) -> FindingResult:
    """Fewer larger-memory GPUs vs more smaller ones.

    Needs one workload on two platforms, at several nodes, where the larger-memory platform
    ran on fewer GPUs; each side's best measured layout (what may differ: :data:`HELD`).
    """
    runs = [f for f in _runs(facts) if f.memory_per_device_gib and f.summary.get("tokens_per_s")]
    best: dict[tuple[str, str], BundleFacts] = {}
    for f in runs:
        key = (f.workload, f.platform)
        if key not in best or f.summary["tokens_per_s"] > best[key].summary["tokens_per_s"]:
            best[key] = f
    platforms = sorted({f"{f.platform} ({f.nodes} node{'s' * (f.nodes > 1)})"
                        for f in _runs(facts)})
    for (wl, _), up in best.items():
        for (wl2, _), out in best.items():
            if (wl == wl2 and up.memory_per_device_gib > out.memory_per_device_gib
                    and up.world_size < out.world_size and min(up.nodes, out.nodes) > 1):
                a, b = up.summary["tokens_per_s"], out.summary["tokens_per_s"]
                said = (f"{wl}: {up.world_size} {up.platform} ({up.layout}) {a:.0f} tokens/s vs "
                        f"{out.world_size} {out.platform} ({out.layout}) {b:.0f} tokens/s, each "
                        "its best measured layout")
                evidence = {"workload": wl,
                            "scale_up": {"platform": up.platform, "gpus": up.world_size,
                                         "tokens_per_s": _r(a, 1)},
                            "scale_out": {"platform": out.platform, "gpus": out.world_size,
                                          "tokens_per_s": _r(b, 1)}}
                plot = Plot("bar", "platform", "tokens/s (best layout)",
                            {wl: [(f"{up.world_size}x {up.platform}", a),
                                  (f"{out.world_size}x {out.platform}", b)]},
                            {wl: [up.measured_steps, out.measured_steps]})
                diffs = differences([up, out], HELD["scale-up"])
                if diffs:
                    return _result("scale-up", "confounded", _beyond(said, diffs), evidence,
                                   [up.name, out.name], plot, diffs)
                return _result("scale-up", "agrees" if a >= b else "disagrees", said, evidence,
                               [up.name, out.name], plot)
    return _unmeasurable(
        "scale-up", "needs one workload measured across nodes on two platforms (fewer "
        "larger-memory GPUs vs more smaller ones); these bundles hold "
        f"{', '.join(platforms) or 'no run'}", platforms=platforms)


# --- TP x PP link use ---------------------------------------------------------------------------

def _fabric_peak_gbps(facts: list[BundleFacts]) -> tuple[float | None, str | None]:
    peak, name = None, None
    for f in facts:
        for p in (f.fabric or {}).get("points", []):
            for key in ("busbw_gbps", "graph_busbw_gbps"):
                v = p.get(key)
                if v is not None and (peak is None or v > peak):
                    peak, name = float(v), f.name
    return peak, name


def tp_pp_links(facts: list[BundleFacts]) -> FindingResult:
    """Link rate of a TP x PP layout against the TP-only layout of the same model and node.

    The rates are over whole measured steps (the counters are read every sampling period), so
    a TP x PP layout that moves fewer bytes per step also shows a lower rate: the evidence gives
    bytes per step beside the rate, and the fabric benchmark's peak says what the link can do.
    """
    held = HELD["tp-pp-links"]
    runs = [f for f in _runs(facts) if f.parallel.get("tp", 1) > 1]
    if not runs:
        return _unmeasurable("tp-pp-links", "needs tensor-parallel layouts (TP only and TP x "
                             "PP); these bundles have none")
    if not any(f.link_gbps for f in runs):
        return _unmeasurable("tp-pp-links", "no NVLink/xGMI byte counters in the tensor-parallel "
                             "bundles (cpu, or a device without link counters)",
                             tensor_parallel_runs=len(runs))
    runs = [f for f in runs if f.link_gbps]
    pairs = [(a, b, differences([a, b], held)) for a in runs for b in runs
             if a.parallel["pp"] == 1 and b.parallel["pp"] > 1 and a.workload == b.workload
             and a.platform == b.platform]
    if not pairs:
        return _unmeasurable("tp-pp-links", "needs a TP-only and a TP x PP layout of one model "
                             "with link counters", layouts=sorted({f.layout for f in runs}))
    a, b, diffs = min(pairs, key=lambda p: len(p[2]))  # a clean pair where there is one
    peak, fabric = _fabric_peak_gbps(facts)

    def entry(f: BundleFacts) -> dict[str, Any]:
        rate = _mean(f.link_gbps)
        step = f.summary.get("step_time_s")
        return {"layout": f.layout, "link_gbps_per_gpu": _r(rate),
                "link_gb_per_step_per_gpu": _r(rate * step if rate and step else None),
                "of_fabric_peak": _r(rate / (2 * peak) if rate and peak else None)}

    ea, eb = entry(a), entry(b)
    ratio = eb["link_gbps_per_gpu"] / ea["link_gbps_per_gpu"] if ea["link_gbps_per_gpu"] else None
    evidence = {"workload": a.workload, "tp_only": ea, "tp_pp": eb, "rate_ratio": _r(ratio),
                "fabric_peak_busbw_gbps": _r(peak)}
    bundles = [a.name, b.name] + ([fabric] if fabric else [])
    readings = [min(f.link_readings.values()) if f.link_readings else None for f in (a, b)]
    plot = Plot("bar", "layout", "link GB/s per GPU (tx + rx)",
                {"link rate": [(ea["layout"], ea["link_gbps_per_gpu"] or 0.0),
                               (eb["layout"], eb["link_gbps_per_gpu"] or 0.0)]},
                {"link rate": readings})
    if ratio is None:
        return _result("tp-pp-links", "not measurable here",
                       f"the TP-only layout {a.layout} moved no link bytes", evidence, bundles,
                       plot)
    peak_note = (f"; the fabric benchmark reached {peak:.0f} GB/s bus bandwidth" if peak
                 else "; no fabric bundle to say what the link can carry")
    said = (f"{b.layout} used {eb['link_gbps_per_gpu']:.1f} GB/s per GPU, {ratio:.0%} of "
            f"{a.layout}'s {ea['link_gbps_per_gpu']:.1f} GB/s")
    if diffs:
        return _result("tp-pp-links", "confounded", _beyond(said, diffs), evidence, bundles,
                       plot, diffs)
    verdict: Verdict = "agrees" if ratio < LINK_UNDERUSE else "disagrees"
    why = (f"{said} (under-use below {LINK_UNDERUSE:.0%}){peak_note}. Rates are over whole "
           "steps, so fewer bytes per step (see evidence) also lower them")
    return _result("tp-pp-links", verdict, why, evidence, bundles, plot)


# --- micro-batch bursts -------------------------------------------------------------------------

def _burst_point(f: BundleFacts) -> dict[str, Any]:
    throttle = f.thermal_throttle()
    excursions = f.device_values("excursions")
    return {"micro_batch": f.micro_batch_size, "global_batch": f.global_batch_size,
            "micro_batches": f.micro_batches, "peak_to_mean": _r(f.worst("peak_to_mean")),
            "power_samples": _samples(f, _worst_device(f, "peak_to_mean")),
            "power_w_mean": _r(f.summary.get("power_w_mean"), 1),
            "excursions": int(sum(excursions.values())) if excursions else None,
            "thermal_throttle": _r(max(throttle.values())) if throttle else None,
            "tokens_per_s": _r(f.summary.get("tokens_per_s"), 1), "mfu": _r(f.summary.get("mfu")),
            "gpu_util_pct": _r(f.gpu_util_pct, 1),
            "execution": f.execution.mode if f.execution else None, "bundle": f.name}


def _slope(series: list[BundleFacts]) -> float:
    """Peak-to-mean rise per doubling of the micro-batch, first to last point."""
    first, last = series[0], series[-1]
    doublings = math.log2(last.micro_batch_size / first.micro_batch_size)
    return (last.worst("peak_to_mean") - first.worst("peak_to_mean")) / doublings


def _one_per_mb(runs: list[BundleFacts]) -> list[BundleFacts]:
    by_mb = {f.micro_batch_size: f for f in sorted(runs, key=lambda f: f.name)}
    return [by_mb[k] for k in sorted(by_mb)]


def _longest_sweep(runs: list[BundleFacts],
                   keys: list[Callable[[BundleFacts], tuple]]) -> list[BundleFacts]:
    """The longest micro-batch sweep among runs of one key, by the first key that gives two
    or more points (a strict key first: runs alike in every held setting)."""
    for key in keys:
        groups: dict[tuple, list[BundleFacts]] = {}
        for f in runs:
            groups.setdefault(key(f), []).append(f)
        longest = max((_one_per_mb(g) for g in groups.values()), key=len, default=[])
        if len(longest) >= 2:
            return longest
    return []


def _ptm_series(runs: list[BundleFacts]) -> tuple[list[tuple[Any, float]], list[int | None]]:
    return ([(f.micro_batch_size, f.worst("peak_to_mean")) for f in runs],
            [_samples(f, _worst_device(f, "peak_to_mean")) for f in runs])


def microbatch_bursts(facts: list[BundleFacts]) -> FindingResult:
    """Peak-to-mean power against the micro-batch size.

    At a fixed global batch and, to separate the micro-batch count (the pipeline's fill) from
    the size, at a fixed count. Every run of both series must match in all but the micro-batch
    and global batch, host-boundness included (issue 58: micro-batch 1 at 60-71% GPU
    utilization against micro-batch 8 at 97% compares the host with the device).
    """
    held = HELD["microbatch-bursts"]
    at_gbs = Held(frozenset({"micro_batch_size"}))

    def strict(f: BundleFacts) -> tuple:
        return alike_key(f, at_gbs)

    def loose(f: BundleFacts) -> tuple:
        return _setting(f, "micro_batch_size")

    runs = [f for f in _runs(facts) if f.worst("peak_to_mean") is not None]
    fixed_gbs = _longest_sweep(runs, [strict, loose])
    if len(fixed_gbs) < 2:
        ran = _longest_sweep(_runs(facts), [strict, loose])
        if len(ran) < 2:
            return _unmeasurable("microbatch-bursts", "needs one layout at two or more "
                                 "micro-batch sizes with the same global batch")
        return _result(
            "microbatch-bursts", "not measurable here",
            f"the sweep ran ({ran[0].layout}, micro-batch "
            f"{', '.join(str(f.micro_batch_size) for f in ran)} at global batch "
            f"{ran[0].global_batch_size}) but without power samples (cpu, or no power "
            "telemetry): no peak-to-mean to compare",
            {"fixed_global_batch": [_burst_point(f) for f in ran]}, [f.name for f in ran])
    ref = fixed_gbs[0]
    by_count: dict[int, list[BundleFacts]] = {}
    for f in runs:
        if alike_key(f, held) == alike_key(ref, held):
            by_count.setdefault(f.micro_batches, []).append(f)
    fixed_count = max((_one_per_mb(g) for g in by_count.values()), key=len, default=[])
    if len(fixed_count) < 2:  # none alike: the same layout and settings, to say what differs
        by_count = {}
        for f in runs:
            if (f.platform, f.workload, f.nodes, f.layout, f.recompute, f.overlap) == (
                    ref.platform, ref.workload, ref.nodes, ref.layout, ref.recompute,
                    ref.overlap):
                by_count.setdefault(f.micro_batches, []).append(f)
        fixed_count = max((_one_per_mb(g) for g in by_count.values()), key=len, default=[])
    rise_a = fixed_gbs[-1].worst("peak_to_mean") - fixed_gbs[0].worst("peak_to_mean")
    gbs = ref.global_batch_size
    evidence: dict[str, Any] = {
        "workload": ref.workload, "layout": ref.layout, "recompute": ref.recompute,
        "fixed_global_batch": [_burst_point(f) for f in fixed_gbs],
        "fixed_micro_batch_count": [_burst_point(f) for f in fixed_count]
        if len(fixed_count) > 1 else [],
        "peak_to_mean_rise_fixed_global_batch": _r(rise_a)}
    name_a = f"global batch {gbs} (count falls)"
    points, counts = _ptm_series(fixed_gbs)
    series, samples = {name_a: points}, {name_a: counts}
    bundles = [f.name for f in fixed_gbs]
    a0, a1 = fixed_gbs[0], fixed_gbs[-1]
    span = (f"at global batch {gbs}, micro-batch {a0.micro_batch_size} -> "
            f"{a1.micro_batch_size} ({a0.micro_batches} -> {a1.micro_batches} micro-batches): "
            f"worst-GPU peak-to-mean {a0.worst('peak_to_mean'):.2f} -> "
            f"{a1.worst('peak_to_mean'):.2f}")
    tps0, tps1 = a0.summary.get("tokens_per_s"), a1.summary.get("tokens_per_s")
    if tps0 and tps1:
        span += f", throughput {tps1 / tps0 - 1:+.0%}"
    if len(fixed_count) > 1:
        name_b = f"{fixed_count[0].micro_batches} micro-batches (global batch grows)"
        series[name_b], samples[name_b] = _ptm_series(fixed_count)
        bundles += [f.name for f in fixed_count]
    plot = Plot("line", "micro-batch size", "worst-GPU peak-to-mean power", series, samples,
                y_origin=1.0)

    def result(verdict: Verdict, why: str,
               diffs: list[Difference] | None = None) -> FindingResult:
        return _result("microbatch-bursts", verdict, why, evidence, bundles, plot, diffs)

    diffs = differences(fixed_gbs, held)
    if diffs:
        return result("confounded", _beyond(span, diffs), diffs)
    if rise_a < PEAK_TO_MEAN_RISE:
        return result("disagrees", f"{span}: not burstier (a rise below {PEAK_TO_MEAN_RISE})")
    if len(fixed_count) < 2:
        return result("not measurable here", f"{span}; the micro-batch count fell with it and "
                      "no runs at a fixed count separate the two causes")
    diffs = differences(list({f.name: f for f in fixed_gbs + fixed_count}.values()), held)
    if diffs:
        return result("confounded", _beyond(f"{span}; the runs at a fixed micro-batch count "
                                            "would separate the count from the size", diffs),
                      diffs)
    slope_a, slope_b = _slope(fixed_gbs), _slope(fixed_count)
    evidence["rise_per_doubling"] = {"fixed_global_batch": _r(slope_a),
                                     "fixed_micro_batch_count": _r(slope_b)}
    held_count = (f"at a fixed {fixed_count[0].micro_batches} micro-batches the rise is "
                  f"{slope_b:+.2f} per doubling against {slope_a:+.2f} at a fixed global batch")
    if slope_b >= 0.5 * slope_a:
        return result("agrees", f"{span}; {held_count}: the micro-batch size itself makes it "
                      "bursty")
    return result("disagrees", f"{span}; but {held_count}: the rise follows the micro-batch "
                  "count (the pipeline bubble grows), not the micro-batch size")


# --- thermals -----------------------------------------------------------------------------------

def _widest(runs: list[BundleFacts], held: Held,
            score: Callable[[list[BundleFacts]], tuple]) -> list[BundleFacts]:
    """The group of runs alike in every setting ``held`` fixes that scores highest."""
    return max(alike_groups(runs, held), key=score, default=[])


def _layouts(runs: list[BundleFacts]) -> int:
    return len({f.layout for f in runs})


def thermal_position(facts: list[BundleFacts]) -> FindingResult:
    """Per-GPU temperature order across layouts.

    Uniform-load layouts (no pipeline, whose stages load GPUs unequally) separate position
    from load. The layouts compared are the most that match in every other setting.
    """
    held = HELD["thermal-position"]
    measured = [f for f in _runs(facts) if len(f.device_values("temp_gpu_c_mean")) >= 2]
    if not measured:
        return _unmeasurable("thermal-position", "needs per-GPU temperatures of two or more "
                             "GPUs (cpu, or a one-GPU node)")
    runs = _widest(measured, held, lambda g: (_layouts(g), len(g)))
    left_out = [f.name for f in measured if f not in runs]
    uniform = [f for f in runs if f.parallel.get("pp", 1) == 1]
    temps = {f.name: f.device_values("temp_gpu_c_mean") for f in runs}
    spreads = {f.name: max(temps[f.name].values()) - min(temps[f.name].values()) for f in runs}
    hottest = {f.name: max(temps[f.name], key=temps[f.name].get) for f in runs}
    corr = [c for i, a in enumerate(runs) for b in runs[i + 1:]
            if (c := _rank_corr(temps[a.name], temps[b.name])) is not None]
    evidence = {
        "runs": [{"layout": f.layout, "workload": f.workload, "bundle": f.name,
                  "temp_spread_c": _r(spreads[f.name], 1), "hottest_gpu": hottest[f.name],
                  "hottest_position": f.chassis.get(hottest[f.name])} for f in runs],
        "order_rank_correlation_mean": _r(float(np.mean(corr))) if corr else None,
        "left_out": left_out}
    names = {f.name: f"{f.layout} {f.workload}" for f in runs}
    plot = Plot("line", "GPU", "mean temperature (deg C)",
                {names[f.name]: sorted(temps[f.name].items()) for f in runs},
                {names[f.name]: [_samples(f, d) for d in sorted(temps[f.name])] for f in runs})
    bundles = [f.name for f in runs]

    def result(verdict: Verdict, why: str) -> FindingResult:
        return _result("thermal-position", verdict, why, evidence, bundles, plot)

    if _layouts(runs) < 2 <= _layouts(measured):
        diffs = differences(measured, held)
        return _result("thermal-position", "confounded", _beyond(
            f"{_layouts(measured)} layouts measured per-GPU temperatures, no two of them alike "
            "in every other setting", diffs), {**evidence, "left_out": []},
            [f.name for f in measured], None, diffs)
    if not uniform:
        return result("not measurable here", "only pipeline layouts, whose stages load GPUs "
                      "unequally: position and load cannot be told apart")
    spread_u = float(np.median([spreads[f.name] for f in uniform]))
    if spread_u < TEMP_CHANGE_C:
        return result("disagrees", f"under uniform-load layouts the GPUs differ by "
                      f"{spread_u:.1f} deg C (median), below {TEMP_CHANGE_C:.0f}: no imbalance")
    if not corr:
        return result("not measurable here", f"GPUs differ by {spread_u:.1f} deg C, but one "
                      "layout cannot show that the order holds whatever the layout")
    mean_corr = float(np.mean(corr))
    if mean_corr >= SAME_ORDER:
        return result("agrees", f"GPUs differ by {spread_u:.1f} deg C under uniform load and "
                      f"keep their order across {len(runs)} layouts (rank correlation "
                      f"{mean_corr:.2f}): position, not layout")
    return result("disagrees", f"GPUs differ by {spread_u:.1f} deg C but the order changes "
                  f"with the layout (rank correlation {mean_corr:.2f}): load, not position")


def pp_throttle(facts: list[BundleFacts]) -> FindingResult:
    """Thermal throttling of the hottest GPU, deepest pipeline against no pipeline.

    Power-cap throttling is counted apart, as another cause. The layouts compared are the most
    that match in every other setting.
    """
    held = HELD["pp-throttle"]
    measured = [f for f in _runs(facts) if f.thermal_throttle() and len(f.devices) >= 2]
    if not measured:
        return _unmeasurable("pp-throttle", "needs throttle reasons of two or more GPUs")

    def both(group: list[BundleFacts]) -> tuple:
        depths = {f.parallel.get("pp", 1) for f in group}
        return (1 in depths and max(depths) > 1, len(group))

    runs = _widest(measured, held, both)
    if not both(runs)[0] and both(measured)[0]:
        diffs = differences(measured, held)
        return _result("pp-throttle", "confounded", _beyond(
            "pipeline and pipeline-free layouts measured throttling, none alike in every other "
            "setting", diffs), {"runs": [f.name for f in measured]},
            [f.name for f in measured], None, diffs)
    deepest = max(f.parallel.get("pp", 1) for f in runs)
    heavy = [f for f in runs if f.parallel.get("pp", 1) == deepest and deepest > 1]
    flat = [f for f in runs if f.parallel.get("pp", 1) == 1]
    if not heavy or not flat:
        return _unmeasurable("pp-throttle", "needs a pipeline layout and one without a "
                             f"pipeline (pipeline depths here: "
                             f"{sorted({f.parallel.get('pp', 1) for f in runs})})")

    def hot(group: list[BundleFacts]) -> float:
        return max(max(f.thermal_throttle().values()) for f in group)

    def cap(f: BundleFacts) -> float | None:
        shares = [(d.get("throttle_frac_by_reason") or {}).get("power_cap") for d in f.devices]
        known = [s for s in shares if s is not None]
        return max(known) if known else None

    def hottest(f: BundleFacts) -> int:
        shares = f.thermal_throttle()
        return max(shares, key=shares.get)

    h, fl = hot(heavy), hot(flat)
    compared = heavy + flat
    evidence = {"runs": [{"layout": f.layout, "bundle": f.name,
                          "thermal_throttle_hottest": _r(max(f.thermal_throttle().values())),
                          "power_cap_throttle_max": _r(cap(f))} for f in compared],
                "pipeline_depth": deepest,
                "left_out": [f.name for f in measured if f not in runs]}
    thermal, power = "thermal (hottest GPU)", "power cap (any GPU)"
    plot = Plot("bar", "layout", "share of samples throttled",
                {thermal: [(f.layout, max(f.thermal_throttle().values())) for f in compared],
                 power: [(f.layout, cap(f) or 0.0) for f in compared]},
                {thermal: [_samples(f, hottest(f)) for f in compared],
                 power: [_samples(f) for f in compared]})
    bundles = [f.name for f in compared]
    caps = [c for f in compared if (c := cap(f)) is not None]
    cap_note = f"; power-cap throttling up to {max(caps):.0%} is another cause" if caps else ""
    if h >= THROTTLE_SHARE and h > fl + THROTTLE_SHARE / 2:
        return _result("pp-throttle", "agrees",
                       f"the hottest GPU throttled for temperature {h:.0%} of samples under "
                       f"PP{deepest} against {fl:.0%} without a pipeline{cap_note}",
                       evidence, bundles, plot)
    return _result("pp-throttle", "disagrees",
                   f"thermal throttling {h:.0%} under PP{deepest} and {fl:.0%} without a "
                   f"pipeline (persistent from {THROTTLE_SHARE:.0%}){cap_note}",
                   evidence, bundles, plot)


def thermal_placement(facts: list[BundleFacts]) -> FindingResult:
    """Not a measurement the kit can make yet: stages are placed in rank order."""
    pipelined = [f.name for f in _runs(facts) if f.parallel.get("pp", 1) > 1]
    return _unmeasurable(
        "thermal-placement", "the kit places pipeline stages on GPUs in rank order; it has no "
        "temperature-aware placement to compare against (the position finding shows where the "
        "hot GPUs are)", pipeline_runs=pipelined)


# --- recomputation and overlap -----------------------------------------------------------------

@dataclass(frozen=True)
class _Toggle:
    """A setting switched on against off: what it is, and when switching it changes nothing.

    Attributes:
        what: The setting in words.
        off: Whether a run has it off.
        on: Whether a run has it on.
        absent: Why a pair has nothing for the setting to act on (None: something).
        inert: Why a pair shows the setting did not act (None: it did, or it cannot be told).
    """

    what: str
    off: Callable[[BundleFacts], bool]
    on: Callable[[BundleFacts], bool]
    absent: Callable[[BundleFacts, BundleFacts], str | None]
    inert: Callable[[BundleFacts, BundleFacts], str | None]


def _pair_label(f: BundleFacts, held: Held) -> str:
    """The pair's layout and the settings that tell it from other pairs (the factor left out)."""
    parts = [f.layout, f"mb{f.micro_batch_size}"]
    if "recompute" not in held.factor and f.recompute != "none":
        parts.append(f"recompute-{f.recompute}")
    if "overlap" not in held.factor and f.overlap:
        parts.append("overlap")
    return " ".join(parts)


def _pair_row(off: BundleFacts, on: BundleFacts, held: Held,
              diffs: list[Difference]) -> dict[str, Any]:
    def rel(key: str) -> float | None:
        x, y = off.summary.get(key), on.summary.get(key)
        return y / x - 1 if x and y is not None else None

    tmax = (on.summary.get("temp_gpu_c_max"), off.summary.get("temp_gpu_c_max"))
    ptm = (on.worst("peak_to_mean"), off.worst("peak_to_mean"))
    exposed = (off.exposed_comm_s, on.exposed_comm_s)
    return {"layout": off.layout, "label": _pair_label(off, held), "workload": off.workload,
            "off": off.name, "on": on.name,
            "step_time_change": _r(rel("step_time_s")),
            "power_w_mean_change": _r(rel("power_w_mean")),
            "energy_j_per_token_change": _r(rel("energy_j_per_token")),
            "temp_gpu_c_max_change": _r(tmax[0] - tmax[1], 1) if None not in tmax else None,
            "peak_to_mean_change": _r(ptm[0] - ptm[1]) if None not in ptm else None,
            "power_samples": _fewest(_samples(off), _samples(on)),
            "gpu_util_pct": [_r(off.gpu_util_pct, 1), _r(on.gpu_util_pct, 1)],
            "execution": [f.execution.describe() if f.execution else None for f in (off, on)],
            "exposed_comm_s_per_step": [_r(x, 4) for x in exposed],
            "differs": [d.as_json() for d in diffs]}


def _pair_said(row: dict[str, Any], what: str) -> str:
    return (f"with {what} on, {row['label']}: step time {row['step_time_change']:+.0%}, mean "
            f"power {row['power_w_mean_change']:+.1%}"
            + (f", hottest GPU {row['temp_gpu_c_max_change']:+.0f} deg C"
               if row["temp_gpu_c_max_change"] is not None else ""))


def _toggle(finding_id: str, facts: list[BundleFacts], toggle: _Toggle) -> FindingResult:
    """The finding from runs with ``toggle``'s setting off and on: pairs that differ in nothing
    else, else the closest pair as ``confounded``; ``not measurable here`` where the setting
    has nothing to act on."""
    held, what = HELD[finding_id], toggle.what
    runs = _runs(facts)
    candidates = [(a, b) for a in runs for b in runs if toggle.off(a) and toggle.on(b)]
    if not candidates:
        why = (f"{what} is on in no run: the factor is absent here"
               if not any(toggle.on(f) for f in runs) else f"no run has {what} off")
        return _unmeasurable(finding_id, f"{why}; needs one layout run with {what} on and off")
    present = [(a, b) for a, b in candidates if toggle.absent(a, b) is None]
    if not present:
        off, on = candidates[0]
        return _unmeasurable(finding_id, toggle.absent(off, on) or "",
                             pairs=[{"off": a.name, "on": b.name} for a, b in candidates])
    judged = [(a, b, differences([a, b], held)) for a, b in present]
    clean = [(a, b) for a, b, d in judged if not d]
    if not clean:
        fewest = min(len(d) for _, _, d in judged)
        closest = [(a, b, d) for a, b, d in judged if len(d) == fewest]
        rows = [_pair_row(a, b, held, d) for a, b, d in closest]
        off, on, diffs = closest[0]
        said = (_pair_said(rows[0], what) if rows[0]["power_w_mean_change"] is not None
                else f"with {what} on, {rows[0]['label']}")
        plot = _toggle_plot(rows, what)
        return _result(finding_id, "confounded",
                       _beyond(f"{said} ({off.name} against {on.name})", diffs),
                       {"pairs": rows}, [n for r in rows for n in (r["off"], r["on"])], plot,
                       diffs)
    checked = [(a, b, toggle.inert(a, b)) for a, b in clean]
    inert = [(a, b, why) for a, b, why in checked if why is not None]
    acting = [(a, b) for a, b, why in checked if why is None]
    rows = [_pair_row(a, b, held, []) for a, b in acting]
    evidence: dict[str, Any] = {"pairs": rows,
                                "inert_pairs": [{"off": a.name, "on": b.name, "why": why}
                                                for a, b, why in inert]}
    if not acting:
        return _unmeasurable(finding_id, inert[0][2], **evidence)
    bundles = [n for r in rows for n in (r["off"], r["on"])]
    verdicts = [abs(r["power_w_mean_change"]) >= POWER_CHANGE
                or abs(r["temp_gpu_c_max_change"] or 0) >= TEMP_CHANGE_C
                or abs(r["peak_to_mean_change"] or 0) >= PEAK_TO_MEAN_RISE
                for r in rows if r["power_w_mean_change"] is not None]
    if not verdicts:
        return _result(finding_id, "not measurable here",
                       f"{what} on/off pairs ran, but without power samples", evidence, bundles)
    plot = _toggle_plot(rows, what)
    said = _pair_said(next(r for r in rows if r["power_w_mean_change"] is not None), what)
    if any(verdicts):
        return _result(finding_id, "agrees", f"{said}: power or temperature moved beyond noise",
                       evidence, bundles, plot)
    return _result(finding_id, "disagrees",
                   f"{said}: power within {POWER_CHANGE:.0%}, temperature within "
                   f"{TEMP_CHANGE_C:.0f} deg C; only speed changed", evidence, bundles, plot)


def _toggle_plot(rows: list[dict[str, Any]], what: str) -> Plot | None:
    """Mean power and the hottest GPU's temperature, change with the setting on, per pair."""
    rows = [r for r in rows if r["power_w_mean_change"] is not None]
    if not rows:
        return None
    power, temp = "mean power (%)", "hottest GPU (deg C)"
    samples = [r["power_samples"] for r in rows]
    return Plot("bar", "pair (layout, micro-batch)", f"change with {what} on",
                {power: [(r["label"], 100 * r["power_w_mean_change"]) for r in rows],
                 temp: [(r["label"], r["temp_gpu_c_max_change"] or 0.0) for r in rows]},
                {power: samples, temp: samples})


def _no_effect(_off: BundleFacts, _on: BundleFacts) -> str | None:
    return None


def recompute_power(facts: list[BundleFacts]) -> FindingResult:
    """Full recomputation on against none, everything else held fixed."""
    return _toggle("recompute-power", facts, _Toggle(
        "full recomputation", lambda f: f.recompute == "none", lambda f: f.recompute == "full",
        _no_effect, _no_effect))


def _nothing_to_overlap(off: BundleFacts, on: BundleFacts) -> str | None:
    """Why ``--overlap`` has nothing to hide in this pair: it overlaps the data-parallel
    gradient reduction (and the distributed optimizer's parameter gather) with the backward,
    over DP x CP ranks; tensor- and pipeline-parallel communication it leaves as it is."""
    if off.optim.get("fsdp") and on.optim.get("fsdp"):
        return (f"{off.layout} runs Megatron-FSDP, which overlaps its gathers and reductions "
                "whether or not --overlap is given: the factor is absent")
    replicas = [f.parallel.get("dp", 1) * f.parallel.get("cp", 1) for f in (off, on)]
    if max(replicas) == 1:
        return (f"{off.layout}: one data-parallel replica, so no gradient reduction for "
                "--overlap to hide (it overlaps the DP x CP gradient reduction and parameter "
                "gather with compute, not tensor- or pipeline-parallel communication): the "
                "factor is absent")
    return None


def _hid_nothing(off: BundleFacts, on: BundleFacts) -> str | None:
    """Why the profiles show that overlap hid no communication (None: it did, or no profile)."""
    before, after = off.exposed_comm_s, on.exposed_comm_s
    if before is None or after is None:
        return None
    if before <= 0:
        return (f"{off.layout}: the profile shows no exposed communication with overlap off, "
                "nothing for overlap to hide")
    if after > before * (1 - EXPOSED_COMM_DROP):
        return (f"{off.layout}: exposed communication {before * 1e3:.1f} -> {after * 1e3:.1f} ms "
                f"per profiled step with overlap on ({after / before - 1:+.0%}, not down by "
                f"{EXPOSED_COMM_DROP:.0%}): overlap hid nothing, so the pair does not test it")
    return None


def overlap_power(facts: list[BundleFacts]) -> FindingResult:
    """Compute-communication overlap on against off, everything else held fixed.

    Not measurable on a layout with no gradient reduction to overlap, nor where the profiles
    show that the exposed communication did not fall with overlap on.
    """
    return _toggle("overlap-power", facts, _Toggle(
        "overlap", lambda f: not f.overlap, lambda f: f.overlap, _nothing_to_overlap,
        _hid_nothing))


VERDICTS: dict[str, Callable[[list[BundleFacts]], FindingResult]] = {
    "scale-up": scale_up, "tp-pp-links": tp_pp_links, "microbatch-bursts": microbatch_bursts,
    "thermal-position": thermal_position, "pp-throttle": pp_throttle,
    "thermal-placement": thermal_placement, "recompute-power": recompute_power,
    "overlap-power": overlap_power,
}
"""Each finding's verdict function, in the catalog's order."""


def all_findings(facts: list[BundleFacts]) -> list[FindingResult]:
    """Every finding's result on these bundles, in the study's order."""
    return [fn(facts) for fn in VERDICTS.values()]
