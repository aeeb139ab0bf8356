"""Device compute of the target layout, per pipeline stage and micro-batch, from a measured one.

Each compute category's measured seconds (kit.projection.sources) become a *rate*: seconds per
unit of work, where the work of a rank per micro-batch is its model FLOPs (Megatron-LM's count,
kit.metrics.flops) divided by how the layout shards that category::

    work(cat) = b x (L_stage x F_layer x r(cat) + [last stage] F_logits) / shard(cat)

``F_layer`` and ``F_logits`` are the FLOPs of one layer and of the logits for one sample;
``shard`` is ``t c`` for MatMul and attention (and a run without a profile) and ``(t if SP
else 1) c`` for norms, element-wise and other kernels (without SP megatron-core runs them on the
whole sequence on every TP rank); ``r`` is the recompute factor: 4/3 on every layer category
with full recompute (one more forward of three passes), 4/3 on attention with selective
recompute (its core attention is recomputed), else 1. Expert parallelism does not change the
work: a rank holds ``E/e`` experts and receives the tokens ``e`` ranks route to them. The
target's seconds are ``rate x work`` times what kit.projection.kinds says the target's GEMM shapes
(a measured GEMM table) or GPU kind change, so a projection to the measured layout returns the
measured seconds.

The optimizer step (phase timers) is taken out of the measured compute (from element-wise and
other kernels, where fused Adam's kernels fall; what it lasted beyond them, out of the idle
time) and scaled by the parameters a rank updates:
its stage's, divided by DP x CP (experts: by their expert-DP group) under the distributed
optimizer. Idle seconds per micro-batch scale with the layers the rank runs (the launch gaps
and synchronizations are per layer); a host-paced step cannot be faster per micro-batch than
the measured micro-batch per layer, which bounds the step from above (kit.projection.step).
"""

from dataclasses import dataclass

from kit.config.run import RunConfig
from kit.metrics.flops import model_flops_per_step
from kit.plan.memory import stage_parameters
from kit.projection.sources import UNPROFILED, MeasuredRun
from kit.projection.volumes import layers_per_stage

_TP_SPLIT = ("MatMul", "attention", UNPROFILED)
"""Categories every TP rank runs on its own shard; the rest are sharded only with SP."""
_OPTIMIZER_CATEGORIES = ("elementwise/memory", "other")
RECOMPUTE_FORWARD = 4 / 3
"""Work of a layer with one more forward pass: (1 + 2 + 1) / (1 + 2) (forward, backward x2)."""


def layer_and_logits_flops(cfg: RunConfig) -> tuple[float, float]:
    """Model FLOPs of one layer and of the logits, per sample (forward and backward)."""
    w, tp = cfg.workload, cfg.parallel.tp
    one = model_flops_per_step(w.model_copy(update={"num_layers": 1}), 1, tp)
    two = model_flops_per_step(w.model_copy(update={"num_layers": 2}), 1, tp)
    return two - one, one - (two - one)


def _recompute(cfg: RunConfig, category: str) -> float:
    mode = cfg.optim.recompute
    if mode == "full" or (mode == "selective" and category == "attention"):
        return RECOMPUTE_FORWARD
    return 1.0


def _shard(cfg: RunConfig, category: str) -> int:
    p = cfg.parallel
    return p.tp * p.cp if category in _TP_SPLIT or p.sp else p.cp


def work(cfg: RunConfig, stage: int, category: str, layers: int | None = None,
         logits: bool | None = None) -> float:
    """Work units of ``category`` one rank of ``stage`` does per micro-batch (module docstring).

    ``layers`` and ``logits`` override the stage's own (its layers; logits on the last stage).
    """
    layer, logits_flops = layer_and_logits_flops(cfg)
    last = stage == cfg.parallel.pp - 1 if logits is None else logits
    n = layers_per_stage(cfg) if layers is None else layers
    per_sample = n * layer * _recompute(cfg, category) + (logits_flops if last else 0)
    return cfg.micro_batch_size * per_sample / _shard(cfg, category)


def optimizer_parameters(cfg: RunConfig, stage: int) -> float:
    """Parameters one rank of ``stage`` updates in its optimizer step."""
    p = cfg.parallel
    params = stage_parameters(cfg, stage)
    if not cfg.optim.dist_optimizer:
        return params.dense + params.expert
    return params.dense / (p.dp * p.cp) + params.expert / max(1, p.dp * p.cp // p.ep)


@dataclass(frozen=True)
class SourceRates:
    """A measured run turned into rates (module docstring)."""

    run: MeasuredRun
    seconds_per_work: dict[str, float]
    """Per compute category."""
    optimizer_s_per_param: float | None
    device_s_per_layer_micro_batch: float
    idle_s_per_layer_micro_batch: float
    whole_s_per_layer_micro_batch: float
    """The measured micro-batch (compute, exposed communication and idle) per layer."""

    @classmethod
    def of(cls, run: MeasuredRun, optimizer_s: float | None) -> "SourceRates":
        """Rates of ``run``; ``optimizer_s`` is its optimizer's seconds per step if known."""
        cfg, parts = run.cfg, run.parts
        compute, idle = dict(parts.compute), parts.idle
        if optimizer_s:
            pool = [k for k in _OPTIMIZER_CATEGORIES if k in compute] or list(compute)
            held = sum(compute[k] for k in pool)
            take = min(optimizer_s, held)
            for k in pool:
                compute[k] -= take * compute[k] / held if held else 0.0
            # An optimizer step longer than its kernels (a host-paced step on a busy host)
            # spent the rest in the measured idle time: taken out there, not counted twice;
            # what neither holds (the timers' steps slower than the profiled ones) is not in
            # the measured step and is left out, so the own layout gives back that step.
            rest = min(optimizer_s - take, idle)
            idle -= rest
            optimizer_s = take + rest
        m = cfg.grad_accum_steps
        rates = {k: v / m / work(cfg, 0, k) for k, v in compute.items() if v > 0}
        layers = layers_per_stage(cfg)
        whole = sum(compute.values()) + sum(parts.communication.values()) + idle
        params = optimizer_parameters(cfg, 0)
        return cls(run, rates, optimizer_s / params if optimizer_s else None,
                   sum(compute.values()) / m / layers, idle / m / layers,
                   whole / m / layers)


@dataclass(frozen=True)
class StageCompute:
    """One target stage's compute, per micro-batch unless named otherwise, seconds."""

    device_s: float
    by_category: dict[str, float]
    measured_device_s: float
    """The measured run's device seconds per micro-batch for as many layers."""
    idle_s: float
    host_floor_s: float
    """The measured micro-batch per layer x this stage's layers: a host-paced lower bound."""
    optimizer_s: float
    """Per step."""
    backward_share: float
    """Share of ``device_s`` in backward (2/3, 3/4 with full recompute)."""
    layer_device_s: float
    """Device seconds of one of the stage's transformer layers (logits left out)."""


def stage_compute(rates: SourceRates, cfg: RunConfig, stage: int,
                  factors: dict[str, float] | None = None,
                  optimizer_factor: float = 1.0) -> StageCompute:
    """The target's compute on one rank of ``stage`` (module docstring).

    ``factors``: per category, what the target's GEMM shapes or GPU kind change beyond the work
    (kit.projection.kinds; missing: 1); ``optimizer_factor`` likewise for the optimizer step.
    """
    f = factors or {}
    by_cat = {k: r * work(cfg, stage, k) * f.get(k, 1.0)
              for k, r in rates.seconds_per_work.items()}
    layers = layers_per_stage(cfg)
    optimizer = (rates.optimizer_s_per_param * optimizer_parameters(cfg, stage) * optimizer_factor
                 if rates.optimizer_s_per_param is not None else 0.0)
    backward = 3 / 4 if cfg.optim.recompute == "full" else 2 / 3
    one_layer = sum(r * work(cfg, stage, k, layers=1, logits=False) * f.get(k, 1.0)
                    for k, r in rates.seconds_per_work.items())
    return StageCompute(sum(by_cat.values()), by_cat,
                        rates.device_s_per_layer_micro_batch * layers,
                        rates.idle_s_per_layer_micro_batch * layers,
                        rates.whole_s_per_layer_micro_batch * layers, optimizer, backward,
                        one_layer)
