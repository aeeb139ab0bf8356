"""This node's verdict on each finding of the study, from bundles' facts (pure functions).

Each function takes every bundle the study has (:class:`kit.study.facts.BundleFacts`), picks
the runs its finding needs by their settings, and returns a :class:`FindingResult`: the
numbers, a verdict (agrees / disagrees / not measurable here) with the reason, the bundles it
rests on, and the data of its figure. Where a finding is about one cause and the runs vary a
second one with it, the verdict compares runs that hold the second fixed (the micro-batch
count in the burst finding; the layout in the recomputation and overlap findings; uniform-load
layouts in the position finding).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from kit.study.catalog import StudyFinding, finding
from kit.study.facts import BundleFacts

Verdict = Literal["agrees", "disagrees", "not measurable here"]

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


@dataclass(frozen=True)
class Plot:
    """The data of a finding's figure: one line (or bar group) per series."""

    kind: Literal["line", "bar"]
    x_label: str
    y_label: str
    series: dict[str, list[tuple[Any, float]]]


@dataclass
class FindingResult:
    """One finding: the study's claim, this node's numbers, the verdict and its bundles."""

    finding: StudyFinding
    verdict: Verdict
    why: str
    evidence: dict[str, Any] = field(default_factory=dict)
    bundles: list[str] = field(default_factory=list)
    plot: Plot | None = None

    def as_json(self) -> dict[str, Any]:
        """The ``findings.json`` entry."""
        return {"finding": self.finding.id, "title": self.finding.title,
                "study": self.finding.reported, "verdict": self.verdict, "why": self.why,
                "evidence": self.evidence, "bundles": sorted(set(self.bundles))}


def _unmeasurable(finding_id: str, why: str, **evidence: Any) -> FindingResult:
    return FindingResult(finding(finding_id), "not measurable here", why, evidence)


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
    ran on fewer GPUs.
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
                verdict: Verdict = "agrees" if a >= b else "disagrees"
                return FindingResult(
                    finding("scale-up"), verdict,
                    f"{wl}: {up.world_size} {up.platform} ({up.layout}) {a:.0f} tokens/s vs "
                    f"{out.world_size} {out.platform} ({out.layout}) {b:.0f} tokens/s, each "
                    "its best measured layout",
                    {"workload": wl, "scale_up": {"platform": up.platform, "gpus": up.world_size,
                                                  "tokens_per_s": _r(a, 1)},
                     "scale_out": {"platform": out.platform, "gpus": out.world_size,
                                   "tokens_per_s": _r(b, 1)}},
                    [up.name, out.name],
                    Plot("bar", "platform", "tokens/s (best layout)",
                         {wl: [(f"{up.world_size}x {up.platform}", a),
                               (f"{out.world_size}x {out.platform}", b)]}))
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
    runs = [f for f in _runs(facts) if f.parallel.get("tp", 1) > 1]
    if not runs:
        return _unmeasurable("tp-pp-links", "needs tensor-parallel layouts (TP only and TP x "
                             "PP); these bundles have none")
    if not any(f.link_gbps for f in runs):
        return _unmeasurable("tp-pp-links", "no NVLink/xGMI byte counters in the tensor-parallel "
                             "bundles (cpu, or a device without link counters)",
                             tensor_parallel_runs=len(runs))
    runs = [f for f in runs if f.link_gbps]
    pairs = [(a, b) for a in runs for b in runs
             if a.parallel["pp"] == 1 and b.parallel["pp"] > 1 and a.workload == b.workload
             and a.platform == b.platform and a.micro_batch_size == b.micro_batch_size
             and a.recompute == b.recompute]
    if not pairs:
        return _unmeasurable("tp-pp-links", "needs a TP-only and a TP x PP layout of one model "
                             "with link counters", layouts=sorted({f.layout for f in runs}))
    a, b = pairs[0]
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
    plot = Plot("bar", "layout", "link GB/s per GPU (tx + rx)",
                {"link rate": [(ea["layout"], ea["link_gbps_per_gpu"] or 0.0),
                               (eb["layout"], eb["link_gbps_per_gpu"] or 0.0)]})
    if ratio is None:
        return FindingResult(finding("tp-pp-links"), "not measurable here",
                             f"the TP-only layout {a.layout} moved no link bytes",
                             evidence, bundles, plot)
    peak_note = (f"; the fabric benchmark reached {peak:.0f} GB/s bus bandwidth" if peak
                 else "; no fabric bundle to say what the link can carry")
    verdict: Verdict = "agrees" if ratio < LINK_UNDERUSE else "disagrees"
    why = (f"{b.layout} used {eb['link_gbps_per_gpu']:.1f} GB/s per GPU, {ratio:.0%} of "
           f"{a.layout}'s {ea['link_gbps_per_gpu']:.1f} GB/s (under-use below "
           f"{LINK_UNDERUSE:.0%}){peak_note}. Rates are over whole steps, so fewer bytes per "
           "step (see evidence) also lower them")
    return FindingResult(finding("tp-pp-links"), verdict, why, evidence, bundles, plot)


# --- micro-batch bursts -------------------------------------------------------------------------

def _burst_point(f: BundleFacts) -> dict[str, Any]:
    throttle = f.thermal_throttle()
    excursions = f.device_values("excursions")
    return {"micro_batch": f.micro_batch_size, "global_batch": f.global_batch_size,
            "micro_batches": f.micro_batches, "peak_to_mean": _r(f.worst("peak_to_mean")),
            "power_w_mean": _r(f.summary.get("power_w_mean"), 1),
            "excursions": int(sum(excursions.values())) if excursions else None,
            "thermal_throttle": _r(max(throttle.values())) if throttle else None,
            "tokens_per_s": _r(f.summary.get("tokens_per_s"), 1), "mfu": _r(f.summary.get("mfu")),
            "bundle": f.name}


def _slope(series: list[BundleFacts]) -> float:
    """Peak-to-mean rise per doubling of the micro-batch, first to last point."""
    first, last = series[0], series[-1]
    doublings = math.log2(last.micro_batch_size / first.micro_batch_size)
    return (last.worst("peak_to_mean") - first.worst("peak_to_mean")) / doublings


def _one_per_mb(runs: list[BundleFacts]) -> list[BundleFacts]:
    by_mb = {f.micro_batch_size: f for f in sorted(runs, key=lambda f: f.name)}
    return [by_mb[k] for k in sorted(by_mb)]


def microbatch_bursts(facts: list[BundleFacts]) -> FindingResult:
    """Peak-to-mean power against the micro-batch size.

    At a fixed global batch and, to separate the micro-batch count (the pipeline's fill) from
    the size, at a fixed count.
    """
    def sweep(runs: list[BundleFacts]) -> list[BundleFacts]:
        groups: dict[tuple, list[BundleFacts]] = {}
        for f in runs:
            groups.setdefault(_setting(f, "micro_batch_size"), []).append(f)
        return max((_one_per_mb(g) for g in groups.values()), key=len, default=[])

    runs = [f for f in _runs(facts) if f.worst("peak_to_mean") is not None]
    fixed_gbs = sweep(runs)
    if len(fixed_gbs) < 2:
        ran = sweep(_runs(facts))
        if len(ran) < 2:
            return _unmeasurable("microbatch-bursts", "needs one layout at two or more "
                                 "micro-batch sizes with the same global batch")
        return FindingResult(
            finding("microbatch-bursts"), "not measurable here",
            f"the sweep ran ({ran[0].layout}, micro-batch "
            f"{', '.join(str(f.micro_batch_size) for f in ran)} at global batch "
            f"{ran[0].global_batch_size}) but without power samples (cpu, or no power "
            "telemetry); throughput only",
            {"fixed_global_batch": [_burst_point(f) for f in ran]}, [f.name for f in ran],
            Plot("line", "micro-batch size", "tokens/s",
                 {ran[0].layout: [(f.micro_batch_size, f.summary.get("tokens_per_s") or 0.0)
                                  for f in ran]}))
    ref = fixed_gbs[0]
    same = [f for f in runs if (f.platform, f.workload, f.nodes, f.layout, f.recompute,
                                f.overlap) == (ref.platform, ref.workload, ref.nodes,
                                               ref.layout, ref.recompute, ref.overlap)]
    by_count: dict[int, list[BundleFacts]] = {}
    for f in same:
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
    series = {f"global batch {gbs} (count falls)":
              [(f.micro_batch_size, f.worst("peak_to_mean")) for f in fixed_gbs]}
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
        count = fixed_count[0].micro_batches
        series[f"{count} micro-batches (global batch grows)"] = [
            (f.micro_batch_size, f.worst("peak_to_mean")) for f in fixed_count]
        bundles += [f.name for f in fixed_count]
    plot = Plot("line", "micro-batch size", "worst-GPU peak-to-mean power", series)

    def result(verdict: Verdict, why: str) -> FindingResult:
        return FindingResult(finding("microbatch-bursts"), verdict, why, evidence, bundles, plot)

    if rise_a < PEAK_TO_MEAN_RISE:
        return result("disagrees", f"{span}: not burstier (a rise below {PEAK_TO_MEAN_RISE})")
    if len(fixed_count) < 2:
        return result("not measurable here", f"{span}; the micro-batch count fell with it and "
                      "no runs at a fixed count separate the two causes")
    slope_a, slope_b = _slope(fixed_gbs), _slope(fixed_count)
    evidence["rise_per_doubling"] = {"fixed_global_batch": _r(slope_a),
                                     "fixed_micro_batch_count": _r(slope_b)}
    held = (f"at a fixed {fixed_count[0].micro_batches} micro-batches the rise is "
            f"{slope_b:+.2f} per doubling against {slope_a:+.2f} at a fixed global batch")
    if slope_b >= 0.5 * slope_a:
        return result("agrees", f"{span}; {held}: the micro-batch size itself makes it bursty")
    return result("disagrees", f"{span}; but {held}: the rise follows the micro-batch count "
                  "(the pipeline bubble grows), not the micro-batch size")


# --- thermals -----------------------------------------------------------------------------------

def thermal_position(facts: list[BundleFacts]) -> FindingResult:
    """Per-GPU temperature order across layouts.

    Uniform-load layouts (no pipeline, whose stages load GPUs unequally) separate position
    from load.
    """
    runs = [f for f in _runs(facts) if len(f.device_values("temp_gpu_c_mean")) >= 2]
    if not runs:
        return _unmeasurable("thermal-position", "needs per-GPU temperatures of two or more "
                             "GPUs (cpu, or a one-GPU node)")
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
        "order_rank_correlation_mean": _r(float(np.mean(corr))) if corr else None}
    plot = Plot("line", "GPU", "mean temperature (deg C)",
                {f"{f.layout} {f.workload}": sorted(temps[f.name].items()) for f in runs})
    bundles = [f.name for f in runs]

    def result(verdict: Verdict, why: str) -> FindingResult:
        return FindingResult(finding("thermal-position"), verdict, why, evidence, bundles, plot)

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

    Power-cap throttling is counted apart, as another cause.
    """
    runs = [f for f in _runs(facts) if f.thermal_throttle() and len(f.devices) >= 2]
    if not runs:
        return _unmeasurable("pp-throttle", "needs throttle reasons of two or more GPUs")
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

    h, fl = hot(heavy), hot(flat)
    evidence = {"runs": [{"layout": f.layout, "bundle": f.name,
                          "thermal_throttle_hottest": _r(max(f.thermal_throttle().values())),
                          "power_cap_throttle_max": _r(cap(f))} for f in heavy + flat],
                "pipeline_depth": deepest}
    plot = Plot("bar", "layout", "share of samples throttled",
                {"thermal (hottest GPU)": [(f.layout, max(f.thermal_throttle().values()))
                                           for f in heavy + flat],
                 "power cap (any GPU)": [(f.layout, cap(f) or 0.0) for f in heavy + flat]})
    bundles = [f.name for f in heavy + flat]
    caps = [c for f in heavy + flat if (c := cap(f)) is not None]
    cap_note = f"; power-cap throttling up to {max(caps):.0%} is another cause" if caps else ""
    if h >= THROTTLE_SHARE and h > fl + THROTTLE_SHARE / 2:
        return FindingResult(finding("pp-throttle"), "agrees",
                             f"the hottest GPU throttled for temperature {h:.0%} of samples "
                             f"under PP{deepest} against {fl:.0%} without a pipeline{cap_note}",
                             evidence, bundles, plot)
    return FindingResult(finding("pp-throttle"), "disagrees",
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

def _toggle(finding_id: str, facts: list[BundleFacts], setting: str,
            on: Callable[[BundleFacts], bool], what: str) -> FindingResult:
    runs = _runs(facts)
    pairs = [(off, o) for off in runs for o in runs
             if not on(off) and on(o) and _setting(off, setting) == _setting(o, setting)]
    if not pairs:
        return _unmeasurable(finding_id, f"needs one layout run with {what} on and off")
    rows, bundles, verdicts = [], [], []
    for off, o in pairs:
        def rel(key: str, a: BundleFacts = off, b: BundleFacts = o) -> float | None:
            x, y = a.summary.get(key), b.summary.get(key)
            return y / x - 1 if x and y is not None else None

        tmax = (o.summary.get("temp_gpu_c_max"), off.summary.get("temp_gpu_c_max"))
        ptm = (o.worst("peak_to_mean"), off.worst("peak_to_mean"))
        row = {"layout": off.layout, "workload": off.workload, "off": off.name, "on": o.name,
               "step_time_change": _r(rel("step_time_s")),
               "power_w_mean_change": _r(rel("power_w_mean")),
               "energy_j_per_token_change": _r(rel("energy_j_per_token")),
               "temp_gpu_c_max_change": _r(tmax[0] - tmax[1], 1) if None not in tmax else None,
               "peak_to_mean_change": _r(ptm[0] - ptm[1]) if None not in ptm else None}
        rows.append(row)
        bundles += [off.name, o.name]
        if row["power_w_mean_change"] is not None:
            verdicts.append(abs(row["power_w_mean_change"]) >= POWER_CHANGE
                            or abs(row["temp_gpu_c_max_change"] or 0) >= TEMP_CHANGE_C
                            or abs(row["peak_to_mean_change"] or 0) >= PEAK_TO_MEAN_RISE)
    plot = Plot("bar", "layout", f"change with {what} on (%)",
                {name: [(r["layout"], 100 * (r[key] or 0.0)) for r in rows]
                 for name, key in (("step time", "step_time_change"),
                                   ("mean power", "power_w_mean_change"),
                                   ("energy/token", "energy_j_per_token_change"))})
    evidence = {"pairs": rows}
    if not verdicts:
        return FindingResult(finding(finding_id), "not measurable here",
                             f"{what} on/off pairs ran, but without power samples",
                             evidence, bundles, plot)
    first = rows[0]
    said = (f"{first['layout']}: step time {first['step_time_change']:+.0%}, mean power "
            f"{first['power_w_mean_change']:+.1%}"
            + (f", hottest GPU {first['temp_gpu_c_max_change']:+.0f} deg C"
               if first["temp_gpu_c_max_change"] is not None else ""))
    if any(verdicts):
        return FindingResult(finding(finding_id), "agrees", f"with {what} on, {said}: power "
                             "or temperature moved beyond noise", evidence, bundles, plot)
    return FindingResult(finding(finding_id), "disagrees",
                         f"with {what} on, {said}: power within {POWER_CHANGE:.0%}, "
                         f"temperature within {TEMP_CHANGE_C:.0f} deg C; only speed changed",
                         evidence, bundles, plot)


def recompute_power(facts: list[BundleFacts]) -> FindingResult:
    """Full recomputation on against off, everything else held fixed."""
    return _toggle("recompute-power", facts, "recompute", lambda f: f.recompute == "full",
                   "full recomputation")


def overlap_power(facts: list[BundleFacts]) -> FindingResult:
    """Compute-communication overlap on against off, everything else held fixed."""
    return _toggle("overlap-power", facts, "overlap", lambda f: f.overlap, "overlap")


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
