"""What the measured bundles say that a projection needs: a step's parts, its power, the links.

A **run** bundle (``charllm-kit run``, ok, megatron engine, no pipeline) gives, per rank and
step, the seconds of device (or, on CPU, host) time in each compute category, in exposed
communication and idle, from its profile breakdowns (kit.metrics.kernels), corrected for the
profiler: on a device timeline the kernels' times are kept and idle becomes the unprofiled
step's remainder (the profiler slows the host, not the kernels); on a host timeline every part
is scaled by the unprofiled step over the profiled window, and a collective's time nested
inside the operator that called it (gloo blocks its caller) moves from that compute to
communication. A run without a profile counts its whole step as compute (category
``unprofiled``). The optimizer's seconds come from the phase timers
(``per_rank[].phase_time_s.optimizer_s``) where the run has them. Power, of the GPUs the ranks
used (the sampler reads every GPU of the node): the run's mean and peak over the measured
steps, and its *warm idle* power, the median of the GPU samples after the first step whose
utilization is 0 (the device holds the model and its clocks, no kernel runs), where at least
:data:`MIN_SAMPLES` exist.

A **fabric** bundle (``charllm-kit fabric``) gives busbw curves (kit.projection.network) and the
power its GPUs drew while the collectives ran: the median of their samples inside the measured
points' windows.
"""

import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from kit.bundle.reader import Bundle
from kit.bundle.verified import read_verified_bundle
from kit.config.run import RunConfig
from kit.engines.execution import execution_of
from kit.errors import KitInputError
from kit.fabric.results import read_fabric
from kit.metrics.attribution import MEASURED, step_windows
from kit.metrics.kernels import IDLE, RankBreakdown, read_breakdowns
from kit.metrics.labels import rank_device
from kit.projection.network import MeasuredFabric

UNPROFILED = "unprofiled"
"""The compute category of a run without a profile: its whole step."""
MIN_SAMPLES = 3
"""Fewest power samples a phase's median is taken from; fewer leave it unmeasured."""


@dataclass(frozen=True)
class StepParts:
    """One rank's measured step, seconds per step, profiler-corrected (module docstring)."""

    compute: dict[str, float]
    """Per compute category (kit.metrics.kernels.COMPUTE, or ``unprofiled``)."""
    communication: dict[str, float]
    """Exposed seconds per collective type."""
    overlap: dict[str, float]
    """Per collective type: overlapped / (overlapped + exposed) seconds, as the run showed."""
    idle: float
    timeline: str
    """``device``, ``host`` or ``none`` (no profile)."""


@dataclass(frozen=True)
class MeasuredPower:
    """A run's power figures (GPU rows), watts; None where not measured."""

    mean_w: float | None
    peak_w: float | None
    idle_w: float | None
    """Warm idle (module docstring)."""


@dataclass(frozen=True)
class MeasuredRun:
    """One run bundle, read for projection."""

    bundle: Bundle
    cfg: RunConfig
    step_s: tuple[float, float, float]
    """Measured step wall times, the profiled steps left out: first quartile, median, third
    quartile (the run's own step-to-step spread, robust to one slow step)."""
    step_samples_s: tuple[float, ...]
    """The same steps' wall times, sorted: the spread a target whose ranks wait on each other
    draws from (kit.projection.host)."""
    parts: StepParts
    optimizer_s: float | None
    """Mean seconds per step in the optimizer (phase timers), None without them."""
    graphed: bool
    """Whether the run replayed its step from one CUDA graph."""
    power: MeasuredPower


@dataclass(frozen=True)
class Inputs:
    """The run and fabric bundles given to ``project``."""

    runs: list[MeasuredRun]
    fabrics: list[MeasuredFabric]
    fabric_bundles: list[Bundle]
    """The fabric bundles, in the order of ``fabrics``."""
    comm_power_w: float | None
    """GPU power while collectives ran (fabric bundles), None where not measured."""


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _rank_parts(rank: RankBreakdown, fallback_step_s: float) -> StepParts:
    """Mean over the rank's profiled steps, corrected for the profiler (module docstring)."""
    steps, n = rank.steps, len(rank.steps)
    totals: dict[str, float] = {}
    kinds: dict[str, str] = {}
    overlapped: dict[str, float] = {}
    for step in steps:
        for c in step.categories:
            totals[c.category] = totals.get(c.category, 0.0) + c.time_s / n
            kinds[c.category] = c.kind
            if c.kind == "communication":
                overlapped[c.category] = overlapped.get(c.category, 0.0) + (
                    c.overlapped_s or 0.0) / n
    window = _mean([s.window_s for s in steps])
    target = rank.unprofiled_step_time_s or fallback_step_s
    compute = {k: v for k, v in totals.items() if kinds[k] == "compute"}
    comm = {k: v for k, v in totals.items() if kinds[k] == "communication"}
    idle = totals.get(IDLE, 0.0)
    if rank.timeline == "host":
        # On the host a blocking collective runs inside the operator that called it: its
        # "overlapped" time is that operator waiting, so it counts as communication.
        nested = sum(overlapped.values())
        held = sum(compute.values())
        compute = {k: v * (1 - nested / held) if held else v for k, v in compute.items()}
        comm = {k: v + overlapped.get(k, 0.0) for k, v in comm.items()}
        overlap: dict[str, float] = {}
        f = target / window if window > 0 else 1.0
        compute = {k: v * f for k, v in compute.items()}
        comm = {k: v * f for k, v in comm.items()}
        idle *= f
    else:
        overlap = {k: overlapped[k] / (overlapped[k] + comm[k]) for k in comm
                   if overlapped.get(k, 0.0) + comm[k] > 0}
        busy = sum(compute.values()) + sum(comm.values())
        if busy > target:  # kernels alone exceed the unprofiled step: shrink them to it
            compute = {k: v * target / busy for k, v in compute.items()}
            comm = {k: v * target / busy for k, v in comm.items()}
            busy = target
        idle = target - busy
    return StepParts(compute, comm, overlap, idle, rank.timeline)


def _mean_parts(parts: list[StepParts]) -> StepParts:
    """The ranks' parts averaged (the ranks of a pp 1 run are alike)."""
    def avg(key: str) -> dict[str, float]:
        names = {k for p in parts for k in getattr(p, key)}
        return {k: _mean([getattr(p, key).get(k, 0.0) for p in parts]) for k in names}

    return StepParts(avg("compute"), avg("communication"), avg("overlap"),
                     _mean([p.idle for p in parts]), parts[0].timeline)


def _step_times(bundle: Bundle, cfg: RunConfig) -> list[float]:
    """Wall time of each measured step the profiler did not slow (max end - min start over
    ranks); every measured step when all were profiled."""
    windows = step_windows(bundle.steps)
    keep = windows.phase == MEASURED
    if cfg.profile_steps is not None:
        first, stop = cfg.profile_steps
        unprofiled = keep & ((windows.step < first) | (windows.step >= stop))
        keep = unprofiled if unprofiled.any() else keep
    return sorted((windows.end - windows.start)[keep].tolist())


def _graphed(bundle: Bundle) -> bool:
    """Whether the run's step was one CUDA graph, as its bundle records it (its ``execution``,
    else its notes)."""
    execution = execution_of(bundle.metrics.execution, bundle.metrics.notes)
    return execution is not None and execution.graphed


def used_devices(bundle: Bundle) -> set[tuple[int, int]]:
    """``(node, device)`` of the GPUs the run's ranks used, by driver index."""
    m = bundle.manifest
    return {(r.node, rank_device(m, r.node, r.local_rank)) for r in m.ranks}


def device_power(bundle: Bundle) -> tuple[float | None, float | None]:
    """Mean and peak power over the devices the ranks used (``per_device`` of metrics.json).

    The sampler reads every GPU of a node; a run on part of a host would otherwise average
    its idle neighbours in. Falls back to the summary where no device entry matches.
    """
    used = used_devices(bundle)
    rows = [d for d in bundle.metrics.per_device if (d.get("node"), d.get("device")) in used
            and isinstance(d.get("power_w_mean"), int | float)]
    s = bundle.metrics.summary
    if not rows:
        return s.get("power_w_mean"), s.get("power_w_peak")
    peaks = [d["power_w_peak"] for d in rows if isinstance(d.get("power_w_peak"), int | float)]
    return _mean([d["power_w_mean"] for d in rows]), max(peaks) if peaks else None


def _warm_idle_w(bundle: Bundle) -> float | None:
    """Median power of the used GPUs' samples with utilization 0 after the first step started
    (module docstring)."""
    tel, steps = bundle.telemetry, bundle.steps
    if tel.num_rows == 0 or steps.num_rows == 0:
        return None
    first = pc.min(steps["t_start"]).as_py()
    mask = pc.and_(pc.and_(pc.equal(tel["source"], "gpu"), pc.greater(tel["t"], first)),
                   pc.equal(tel["util_gpu_pct"], 0))
    rows = tel.filter(pc.fill_null(mask, False))
    used = used_devices(bundle)
    keep = [(n, d) in used for n, d in zip(rows["node"].to_pylist(), rows["device"].to_pylist(),
                                            strict=True)]
    power = pc.drop_null(rows.filter(keep)["power_w"]).to_numpy() if rows.num_rows else []
    return float(np.median(power)) if len(power) >= MIN_SAMPLES else None


def _optimizer_s(bundle: Bundle) -> float | None:
    times = [r["phase_time_s"]["optimizer_s"] for r in bundle.metrics.per_rank
             if isinstance(r.get("phase_time_s"), dict)
             and isinstance(r["phase_time_s"].get("optimizer_s"), int | float)]
    return _mean(times) if times else None


def measured_run(bundle: Bundle) -> MeasuredRun:
    """Read one run bundle for projection (module docstring).

    Raises:
        KitInputError: Not an ok megatron run without pipeline stages, or no measured steps.
    """
    m = bundle.manifest
    name = bundle.path.name
    if m.status != "ok":
        raise KitInputError(f"{name} ended {m.status}: project from a run that ended ok")
    cfg = RunConfig.model_validate(m.config)
    if cfg.engine != "megatron":
        raise KitInputError(f"{name} ran the {cfg.engine} engine: the projection models "
                            "megatron-core's collectives only")
    if cfg.parallel.pp > 1:
        raise KitInputError(f"{name} has {cfg.parallel.pp} pipeline stages: project from a run "
                            "without pipeline parallelism (its bubble is not separated yet)")
    times = _step_times(bundle, cfg)
    if not times:
        raise KitInputError(f"{name} has no measured steps")
    median = statistics.median(times)
    q1, _, q3 = (statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1
                  else (median,) * 3)
    breakdowns = [r for r in read_breakdowns(bundle) if r.steps]
    optimizer = _optimizer_s(bundle)
    if breakdowns:
        parts = _mean_parts([_rank_parts(r, median) for r in breakdowns])
    else:
        parts = StepParts({UNPROFILED: median}, {}, {}, 0.0, "none")
    power = MeasuredPower(*device_power(bundle), _warm_idle_w(bundle))
    return MeasuredRun(bundle, cfg, (min(q1, median), median, max(q3, median)), tuple(times),
                       parts, optimizer, _graphed(bundle), power)


def _comm_power_w(bundles: list[Bundle]) -> float | None:
    """Median GPU power inside the fabric bundles' measured points (module docstring)."""
    samples: list[np.ndarray] = []
    for b in bundles:
        results = read_fabric(b)
        tel = b.telemetry
        if results is None or tel.num_rows == 0:
            continue
        t = tel["t"].to_numpy()
        used = used_devices(b)
        gpu = np.array([(n, d) in used for n, d in zip(tel["node"].to_pylist(),
                                                        tel["device"].to_pylist(), strict=True)])
        power = tel["power_w"].to_numpy(zero_copy_only=False)
        inside = np.zeros(len(t), dtype=bool)
        for p in results.points:
            inside |= (t >= p.t_start) & (t <= p.t_end)
        chosen = power[inside & gpu]
        samples.append(chosen[~np.isnan(chosen.astype(float))])
    pooled = np.concatenate(samples) if samples else np.empty(0)
    return float(np.median(pooled)) if len(pooled) >= MIN_SAMPLES else None


def read_inputs(paths: list[str | Path]) -> Inputs:
    """Read (verified) run and fabric bundles.

    Raises:
        KitInputError: A path that is not a verified bundle, a bundle given twice, a run that
            cannot be projected from (:func:`measured_run`), or no run bundle at all.
    """
    runs, fabrics, fabric_bundles, seen = [], [], [], set()
    for p in paths:
        bundle = read_verified_bundle(p)
        where = bundle.path.resolve()
        if where in seen:
            raise KitInputError(f"bundle {p} is given twice; give each bundle once")
        seen.add(where)
        results = read_fabric(bundle)
        if results is not None:
            nodes = int(bundle.manifest.config.get("nodes", 1))
            fabrics.append(MeasuredFabric(bundle.path.name, results, nodes,
                                          results.ranks // nodes))
            fabric_bundles.append(bundle)
        elif bundle.manifest.workload.get("family") == "fabric":
            raise KitInputError(f"{p} is a fabric bundle without results (it did not end ok)")
        else:
            runs.append(measured_run(bundle))
    if not runs:
        raise KitInputError("no run bundle given: project needs at least one measured training "
                            "run (charllm-kit run ..., ideally with --profile)")
    return Inputs(runs, fabrics, fabric_bundles, _comm_power_w(fabric_bundles))
