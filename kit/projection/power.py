"""Per-GPU power and energy of the projected step, from the power of its phases.

A GPU draws ``P_compute`` while its kernels compute, ``P_comm`` while it only communicates and
``P_idle`` while it waits. The measured run fixes ``P_compute``: its mean power over its
measured steps ``P_run`` is the time-weighted mean of the three over its step's parts
(kit.projection.sources)::

    P_run (C + E + I) = C P_compute + E P_comm + I P_idle

with ``P_idle`` the run's warm idle power and ``P_comm`` the power a fabric bundle drew during
its collectives (where it was not measured: ``P_idle``; NCCL's kernels keep few SMs busy).
The target's stage ``s`` then draws ``(C_s P_compute + E_s P_comm + I_s P_idle) / T`` where
``C_s`` is its compute per step (micro-batches and optimizer), ``E_s`` its exposed
communication and ``I_s = T - C_s - E_s`` the rest of the step (idle gaps, bubble, waiting for
the slowest stage); the mean over stages is the per-GPU mean, and the energy per token is the
step's energy over all GPUs divided by its tokens.

Alternatives the interval spans: power in short idle gaps and in communication may stay at
``P_compute`` (clocks and rails do not drop within milliseconds, and NVML's power is an
average), so the low/high ends also take ``P_idle`` and ``P_comm`` equal to ``P_compute``,
each solved again against the run; and the step time at its own ends. The peak is the run's:
the same kernels peak alike (a power-capped GPU stays capped). On another GPU kind every phase
power is the source's times the ratio of the datasheets' TDPs (a first-order guess recorded as
such: the same kernels draw the same share of the power limit).
"""

import itertools
from dataclasses import dataclass

from kit.config.run import RunConfig
from kit.projection.sources import MeasuredRun
from kit.projection.span import Span
from kit.projection.step import StepModel


@dataclass(frozen=True)
class PhasePower:
    """The phase powers behind a projection's point, watts (None: not measured)."""

    compute_w: float
    comm_w: float | None
    idle_w: float | None


@dataclass(frozen=True)
class PowerProjection:
    """Projected power and energy."""

    mean_w: Span
    peak_w: float | None
    energy_j_per_token: Span
    phases: PhasePower
    """The point's phase powers (``comm_w`` as used: the fabric's or the idle power)."""
    scale: float = 1.0
    """What every phase power was multiplied by (another GPU kind's TDP ratio)."""


def _solve_compute_w(run: MeasuredRun, idle_w: float | None, comm_w: float | None) -> float | None:
    """``P_compute`` from the run's mean power; None (pi/pm) means 'equal to P_compute'."""
    parts, mean = run.parts, run.power.mean_w
    if mean is None:
        return None
    c, e, i = sum(parts.compute.values()), sum(parts.communication.values()), parts.idle
    weight = c + (e if comm_w is None else 0.0) + (i if idle_w is None else 0.0)
    rest = (e * comm_w if comm_w is not None else 0.0) + (i * idle_w if idle_w is not None
                                                          else 0.0)
    if weight <= 0:
        return None
    p = (mean * (c + e + i) - rest) / weight
    return p if p > 0 else None


def _stage_energy(step: StepModel, m: int, scenario: int, p_c: float, p_comm: float,
                  p_idle: float) -> list[float]:
    """Energy of one GPU of each stage per step, joules, at ``scenario`` (0 low, 1 point, 2
    high) of the step time and communication."""
    total = step.step_s.as_list()[scenario]
    out = []
    for s in step.stages:
        compute = m * s.compute.device_s + s.compute.optimizer_s
        comm = (m * s.blocking_comm_s.as_list()[scenario] + s.tail_comm_s.as_list()[scenario])
        if compute + comm > total:  # a step at the low end of the run's spread: all of it faster
            compute, comm = compute * total / (compute + comm), comm * total / (compute + comm)
        idle = total - compute - comm
        out.append(compute * p_c + comm * p_comm + idle * p_idle)
    return out


def project_power(run: MeasuredRun, comm_w: float | None, cfg: RunConfig,
                  step: StepModel, scale: float = 1.0) -> PowerProjection | None:
    """Mean and peak power per GPU and energy per token (module docstring); None when the run
    has no power telemetry. ``scale`` multiplies every phase power (another GPU kind: the
    datasheet TDP ratio, kit.projection.model)."""
    idle_w = run.power.idle_w
    point_comm = comm_w if comm_w is not None else idle_w
    point_c = _solve_compute_w(run, idle_w, point_comm)
    if point_c is None:
        return None
    m = cfg.grad_accum_steps
    gpus_per_stage = cfg.world_size // cfg.parallel.pp
    tokens = cfg.tokens_per_step
    means, energies = [], []
    point_mean = point_energy = 0.0
    for scenario, pi, pm in itertools.product((0, 1, 2), (idle_w, None), (point_comm, None)):
        p_c = _solve_compute_w(run, pi, pm)
        if p_c is None:
            continue
        per_stage = _stage_energy(step, m, scenario, p_c, p_c if pm is None else pm,
                                  p_c if pi is None else pi)
        total = step.step_s.as_list()[scenario]
        mean = sum(per_stage) / len(per_stage) / total
        energy = sum(per_stage) * gpus_per_stage / tokens
        means.append(mean)
        energies.append(energy)
        if scenario == 1 and pi is idle_w and pm is point_comm:
            point_mean, point_energy = mean, energy
    def times(w: float | None) -> float | None:
        return None if w is None else w * scale

    return PowerProjection(Span.of(*means, point=point_mean).scale(scale),
                           times(run.power.peak_w),
                           Span.of(*energies, point=point_energy).scale(scale),
                           PhasePower(point_c * scale, times(point_comm), times(idle_w)), scale)
