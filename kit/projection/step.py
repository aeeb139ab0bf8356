"""One optimizer step of the target layout, assembled from its stages' parts.

Per stage and micro-batch (seconds on one rank): ``t_s = compute + idle + blocking
communication`` (TP/SP, CP, EP and pipeline exchanges: megatron-core's local spec runs them in
the compute stream's path). The ends of each span (kit.projection.span):

* idle: the point carries the measured idle per layer; ``low`` shrinks it with the device
  work per layer (idle that is device-side gaps); ``high`` keeps it;
* communication: ``high`` at the slowest rank's measured time (kit.projection.network);
* ``high`` is at least the host floor when the target's step is eager (not one CUDA graph): a
  step paced by its host, at the measured micro-batch per layer, does not speed up when its
  kernels shrink (TP, CP) or get fewer samples. Where the measured run was eager too (its
  host's pace is what it measured), the point is at least that floor as well;
* an eager pipeline stage also waits, after each p2p call, for the device to drain
  (kit.projection.host.p2p_sync_s): ``sync_s`` per micro-batch.

The 1F1B pipeline (Narayanan et al., SC'21) with ``m`` micro-batches, ``p`` stages and ``v``
virtual stages takes ``m max_s t_s + (sum_s t_s - max_s t_s) / v``: for equal stages
``(m + (p - 1)/v) t``, a bubble of ``(p - 1) / (v m + p - 1)`` of the pipeline.

After the last micro-batch each stage reduces its gradients, steps its optimizer and (with the
distributed optimizer) gathers its parameters; the step ends when the slowest stage has. With
``--overlap`` the gradient reduction hides behind the last micro-batch's backward and the
parameter gather behind the first micro-batch's forward: the point exposes only what exceeds
them (or the overlap the measured run showed for that collective, where its layout overlapped
the same way), ``high`` exposes all of it.
"""

from dataclasses import dataclass, field

from kit.config.run import RunConfig
from kit.projection.compute import StageCompute
from kit.projection.host import p2p_sync_s
from kit.projection.network import Links
from kit.projection.span import ZERO, Span, span_max, span_sum
from kit.projection.volumes import Collective


@dataclass(frozen=True)
class CollectiveTime:
    """One collective of one stage with its projected time per micro-batch or per step."""

    stage: int
    collective: Collective
    time_s: Span
    exposed_s: Span


@dataclass(frozen=True)
class StageStep:
    """One stage's parts, seconds."""

    stage: int
    compute: StageCompute
    micro_batch_s: Span
    """``t_s``: compute, idle and blocking communication of one micro-batch."""
    blocking_comm_s: Span
    """Per micro-batch."""
    idle_s: Span
    """Per micro-batch."""
    sync_s: Span
    """Per micro-batch: the device drain after the p2p calls of an eager pipeline."""
    tail_s: Span
    """After the pipeline: exposed gradient/parameter collectives and the optimizer."""
    tail_comm_s: Span


@dataclass(frozen=True)
class StepModel:
    """The projected step and its parts."""

    step_s: Span
    pipeline_s: Span
    bubble_s: float
    """Point estimate of the pipeline's bubble: ``pipeline - m max_s t_s``."""
    bubble_frac_analytical: float | None
    """``(p - 1) / (v m + p - 1)``, None without pipeline parallelism."""
    stages: list[StageStep]
    collectives: list[CollectiveTime] = field(default_factory=list)


def _exposed_tail(c: Collective, t: Span, compute: StageCompute, cfg: RunConfig,
                  measured_overlap: float | None) -> Span:
    """Exposed time of a per-step collective (module docstring)."""
    if not cfg.optim.overlap or c.overlap == "none":
        return t
    hide = compute.device_s * (compute.backward_share if c.overlap == "dp_grad"
                               else 1 - compute.backward_share)
    design = Span(max(0.0, t.low - hide), max(0.0, t.point - hide), t.high)
    if measured_overlap is None or c.overlap != "dp_grad":
        return design
    point = t.point * (1 - measured_overlap)
    return Span(min(design.low, point), point, t.high)


def stage_step(cfg: RunConfig, stage: int, compute: StageCompute,
               collectives: list[Collective], links: Links, measured_overlap: dict[str, float],
               eager: bool, host_paced: bool = False) -> tuple[StageStep, list[CollectiveTime]]:
    """One stage's micro-batch and tail (module docstring), and its collectives' times.

    ``measured_overlap`` is the overlapped share per operation (``all_reduce``, ...) the
    measured run showed, where its layout overlapped its gradient reduction as the target's.
    ``eager``: the target's step is not one CUDA graph, so its host may pace it;
    ``host_paced``: the measured run was eager too, so its host floor is the point's floor.
    """
    blocking, tail_comm, times = [], [], []
    for c in collectives:
        t = links.time(cfg, c)
        if c.scope == "micro_batch":
            blocking.append(t)
            times.append(CollectiveTime(stage, c, t, t))
        else:
            exposed = _exposed_tail(c, t, compute, cfg, measured_overlap.get(c.op))
            tail_comm.append(exposed)
            times.append(CollectiveTime(stage, c, t, exposed))
    comm = span_sum(blocking)
    measured = compute.measured_device_s
    shrink = compute.device_s / measured if measured > 0 else 1.0
    idle = Span(compute.idle_s * min(1.0, shrink), compute.idle_s, compute.idle_s)
    t = Span.exact(compute.device_s) + idle + comm
    sync = ZERO
    if eager:
        floor = compute.host_floor_s
        point = max(t.point, floor) if host_paced else t.point
        t = Span(t.low, point, max(t.high, floor, point))
        sync = p2p_sync_s(compute.layer_device_s, compute.backward_share, stage,
                          cfg.parallel.pp, cfg.parallel.vpp or 1)
        t = t + sync
    tail_c = span_sum(tail_comm)
    return StageStep(stage, compute, t, comm, idle, sync,
                     tail_c + Span.exact(compute.optimizer_s), tail_c), times


def pipeline(stages: list[StageStep], micro_batches: int, virtual: int) -> Span:
    """``m max_s t_s + (sum_s t_s - max_s t_s) / v`` end-wise."""
    def end(values: list[float]) -> float:
        top = max(values)
        return micro_batches * top + (sum(values) - top) / virtual

    ts = [s.micro_batch_s for s in stages]
    return Span(end([t.low for t in ts]), end([t.point for t in ts]), end([t.high for t in ts]))


def assemble(cfg: RunConfig, stages: list[StageStep],
             collectives: list[CollectiveTime]) -> StepModel:
    """The step: pipeline plus the slowest stage's tail."""
    p = cfg.parallel
    m, v = cfg.grad_accum_steps, p.vpp or 1
    pipe = pipeline(stages, m, v)
    tail = ZERO
    for s in stages:
        tail = span_max(tail, s.tail_s)
    bubble = pipe.point - m * max(s.micro_batch_s.point for s in stages)
    analytical = (p.pp - 1) / (v * m + p.pp - 1) if p.pp > 1 else None
    return StepModel(pipe + tail, pipe, bubble, analytical, stages, collectives)
