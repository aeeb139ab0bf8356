"""``charllm-kit project``: measured bundles in, a projected-bundle file out.

1. Read the run and fabric bundles (kit.projection.sources), resolve the target as ``run
   --dry-run`` would on the runs' platform (kit.projection.request).
2. Choose the run to scale: same platform, same architecture but for its depth; then, in this
   order, the same execution (one CUDA graph per step or eager, as the target would run), a
   profile breakdown, the same micro-batch, the same recompute, the nearest TP degree.
3. Per target stage: compute (kit.projection.compute), collectives (kit.projection.volumes) and
   their times (kit.projection.network), assembled into a step (kit.projection.step), widened by
   the chosen run's own step-to-step spread; for an eager target from an eager run, its
   ranks waiting on each other's hosts (kit.projection.host); power and energy
   (kit.projection.power).
4. Write the summary keys a bundle has, each projected one with its interval, the parts, the
   assumptions and the inputs (kit.projection.file).

docs/projection.md states the model with its sources and limits.
"""

import hashlib
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import kit
from kit.config.loader import load_platform
from kit.config.run import RunConfig
from kit.errors import KitInputError
from kit.metrics.flops import model_flops_per_step
from kit.metrics.labels import layout_label
from kit.plan.memory import GIB
from kit.projection.compute import SourceRates, optimizer_parameters, stage_compute
from kit.projection.file import CollectiveRecord, ProjectionFile, ProjectionInput, StageRecord
from kit.projection.gemm import is_gemm_table
from kit.projection.host import coupling
from kit.projection.kinds import KindScale, datasheet, kind_scale, read_tables
from kit.projection.network import Links, place
from kit.projection.power import PowerProjection, project_power
from kit.projection.request import ProjectionTarget, plan_target
from kit.projection.sources import UNPROFILED, Inputs, MeasuredRun, read_inputs
from kit.projection.span import Span
from kit.projection.step import StepModel, assemble, stage_step
from kit.projection.volumes import stage_collectives

_NOT_ARCHITECTURE = frozenset({"name", "description", "num_layers", "micro_batch_size",
                               "global_batch_size", "scaling", "moe_capacity_factor",
                               "moe_pad_to_capacity"})
"""Workload fields a measured run may differ in from the target: batch and depth are scaled,
and an MoE's capacity routing changes how its step executes (graphed or eager, which the
projection reads from the run's bundle), not its layers' shapes."""
_OVERLAP_OPS = {"AllReduce": "all_reduce", "ReduceScatter": "reduce_scatter",
                "AllGather": "all_gather"}


def _architecture(workload: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in workload.items() if k not in _NOT_ARCHITECTURE}


def _same_model(run: MeasuredRun, target: RunConfig) -> bool:
    return (_architecture(run.cfg.workload.model_dump(mode="json"))
            == _architecture(target.workload.model_dump(mode="json")))


def _target_graphed(cfg: RunConfig) -> bool:
    from kit.engines import engine_spec

    return engine_spec(cfg.engine).execution(cfg).graphed


def _choose(runs: list[MeasuredRun], cfg: RunConfig, graphed: bool) -> MeasuredRun:
    """The run to scale (module docstring, step 2); ``graphed``: the target's execution."""

    def key(r: MeasuredRun) -> tuple[Any, ...]:
        c = r.cfg
        return (r.graphed != graphed, r.parts.timeline == "none",
                abs(math.log(c.micro_batch_size / cfg.micro_batch_size)),
                c.optim.recompute != cfg.optim.recompute,
                abs(math.log(c.parallel.tp / cfg.parallel.tp)))

    return min(runs, key=key)


def _optimizer_s(chosen: MeasuredRun, runs: list[MeasuredRun]) -> tuple[float | None,
                                                                        MeasuredRun | None]:
    """The chosen run's optimizer seconds per step, else another run's scaled by parameters."""
    if chosen.optimizer_s is not None:
        return chosen.optimizer_s, chosen
    other = next((r for r in runs if r.optimizer_s is not None), None)
    if other is None:
        return None, None
    per_param = other.optimizer_s / optimizer_parameters(other.cfg, 0)
    return per_param * optimizer_parameters(chosen.cfg, 0), other


def _measured_overlap(chosen: MeasuredRun, cfg: RunConfig) -> dict[str, float]:
    """Overlap the run showed for its gradient collectives, where it overlaps as the target."""
    c = chosen.cfg
    only_dp = c.parallel.tp == c.parallel.cp == c.parallel.ep == 1 and c.parallel.dp > 1
    if not only_dp or c.optim.overlap != cfg.optim.overlap:
        return {}
    return {_OVERLAP_OPS[k]: v for k, v in chosen.parts.overlap.items() if k in _OVERLAP_OPS}


def _sums_sha256(run_path: Path) -> str:
    return hashlib.sha256((run_path / "SHA256SUMS").read_bytes()).hexdigest()


def _input(role: str, bundle_path: Path, given: str, what: str) -> ProjectionInput:
    return ProjectionInput(role=role, bundle=bundle_path.name, path=given,  # type: ignore[arg-type]
                           sums_sha256=_sums_sha256(bundle_path), what=what)


def _run_what(r: MeasuredRun) -> str:
    c = r.cfg
    profiled = "profiled" if r.parts.timeline != "none" else "no profile"
    return (f"{c.workload.name} on {c.platform.name} x{c.world_size} "
            f"{layout_label(r.bundle.manifest.config)}, {profiled}, "
            f"{'CUDA graph' if r.graphed else 'eager'} step")


def _inputs(given: dict[Path, str], inputs: Inputs, chosen: MeasuredRun,
            optimizer_from: MeasuredRun | None) -> list[ProjectionInput]:
    out = []
    for r in inputs.runs:
        role = ("compute" if r is chosen else "optimizer" if r is optimizer_from else "unused")
        out.append(_input(role, r.bundle.path, given[r.bundle.path.resolve()], _run_what(r)))
    for f in inputs.fabric_bundles:
        out.append(_input("fabric", f.path, given[f.path.resolve()],
                          f"fabric on {f.manifest.platform['name']}: "
                          f"{f.manifest.config['parallel']['dp']} ranks"))
    return out


def _model_step(cfg: RunConfig, rates: SourceRates, links: Links,
                overlap: dict[str, float], graphed: bool, scale: KindScale) -> StepModel:
    stages, times = [], []
    optimizer = scale.memory_ratio if scale.cross_kind else 1.0
    host_paced = not graphed and not rates.run.graphed
    for s in range(cfg.parallel.pp):
        compute = stage_compute(rates, cfg, s, scale.factors(cfg, s), optimizer)
        stage, collectives = stage_step(cfg, s, compute,
                                        stage_collectives(cfg, s), links, overlap,
                                        eager=not graphed, host_paced=host_paced)
        stages.append(stage)
        times += collectives
    return assemble(cfg, stages, times)


def _summary(cfg: RunConfig, step: Span, power: PowerProjection | None,
             mem_gib: float) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """The canonical summary (point) and each projected key's ``[low, point, high]``."""
    tokens = cfg.tokens_per_step
    flops = model_flops_per_step(cfg.workload, cfg.global_batch_size, cfg.parallel.tp)
    peak = cfg.platform.peak_tflops.get(cfg.dtype)
    inverse = Span(1 / step.high, 1 / step.point, 1 / step.low)
    tflops = inverse.scale(flops / cfg.world_size / 1e12)
    spans: dict[str, Span] = {"step_time_s": step, "tokens_per_s": inverse.scale(tokens),
                              "tflops_per_gpu": tflops}
    if peak:
        spans["mfu"] = tflops.scale(1 / peak)
    if power is not None:
        spans["power_w_mean"] = power.mean_w
        spans["energy_j_per_token"] = power.energy_j_per_token
    summary: dict[str, Any] = {
        "step_time_s": None, "tokens_per_s": None, "tflops_per_gpu": None, "mfu": None,
        "energy_j_per_token": None, "power_w_mean": None,
        "power_w_peak": power.peak_w if power is not None else None,
        "temp_gpu_c_max": None, "temp_gpu_c_spread": None, "clock_sm_frac_of_max": None,
        "throttle_frac": None, "mem_peak_gib": mem_gib, "world_size": cfg.world_size}
    summary.update({k: v.point for k, v in spans.items()})
    return summary, {k: v.as_list() for k, v in spans.items()}


def _compute_assumption(chosen: MeasuredRun, scale: KindScale) -> list[str]:
    head = (f"compute scaled from {chosen.bundle.path.name} ({_run_what(chosen)}) by model FLOPs "
            "per rank and micro-batch: TP and CP shard every GEMM and attention, norms and "
            "element-wise kernels only with SP; ")
    if scale.source_eff_tflops is None or scale.target_table is None:
        why = (f"no GEMM table of {scale.target_kind}" if scale.target_table is None
               else "no MatMul time in the measured run (no profile)")
        out = [head + f"{why}: kernel efficiency is the measured one at every shape (a TP "
               "shard's smaller GEMMs run slower than that: the step is then under-predicted)"]
    else:
        src = scale.source_table
        out = [head + "MatMul efficiency by shape from the GEMM table "
               + (scale.target_table.path.name if src is scale.target_table
                  else f"{src.path.name if src else '?'} -> {scale.target_table.path.name}")
               + f" (the source run's GEMMs at {scale.source_eff_tflops:.4g} TFLOP/s there); "
               "attention and the other kernels at the measured efficiency"]
    if scale.cross_kind:
        out.append(f"another GPU kind: measured on {scale.source_kind}, projected onto "
                   f"{scale.target_kind}; norm, element-wise, other kernels and the optimizer by "
                   f"the datasheet memory bandwidth ratio (x{scale.memory_ratio:.3g}), attention "
                   f"by the dense peak ratio (x{scale.peak_ratio:.3g}), host gaps as measured")
    return out


def _assumptions(cfg: RunConfig, chosen: MeasuredRun, optimizer_from: MeasuredRun | None,
                 links: Links, power: PowerProjection | None, graphed: bool,
                 scale: KindScale) -> list[str]:
    src = chosen.cfg
    out = [
        *_compute_assumption(chosen, scale),
        *links.describe(),
        "TP, SP, CP, EP and PP exchanges block the compute stream (megatron-core's local spec, "
        "no Transformer Engine overlap); pipeline: 1F1B with the measured-per-layer stage time",
    ]
    if src.workload.num_layers != cfg.workload.num_layers:
        out.append(f"depth: {src.workload.num_layers} measured layers scaled to "
                   f"{cfg.workload.num_layers}, every layer alike")
    if src.micro_batch_size != cfg.micro_batch_size:
        out.append(f"micro-batch {src.micro_batch_size} measured, {cfg.micro_batch_size} "
                   "projected: time per sample taken as the measured one")
    if chosen.parts.timeline == "none":
        out.append("no profile breakdown: the whole measured step counted as compute (idle and "
                   "exposed communication included)")
    if optimizer_from is None:
        out.append("optimizer time unknown (no phase timers): it stays in the per-micro-batch "
                   "compute")
    elif optimizer_from is not chosen:
        out.append(f"optimizer time from {optimizer_from.bundle.path.name}'s phase timers, "
                   "scaled by parameters per rank")
    if chosen.graphed != graphed:
        out.append(f"the measured step was {'one CUDA graph' if chosen.graphed else 'eager'}, "
                   f"the target's would be {'one CUDA graph' if graphed else 'eager'}: host "
                   "overhead differs (the interval's high end assumes a host-paced step)")
    if power is None:
        out.append("power not projected: the measured run has no GPU power telemetry")
    else:
        ph = power.phases
        out.append(f"power: compute {ph.compute_w:.0f} W solved from the run's mean, idle "
                   + (f"{ph.idle_w:.0f} W (warm idle samples)" if ph.idle_w is not None
                      else "as compute (no warm idle samples)")
                   + ", communication " + (f"{ph.comm_w:.0f} W" if ph.comm_w is not None
                                           else "as compute")
                   + "; peak as measured"
                   + (f"; x{power.scale:.3g}, the {scale.target_kind}/{scale.source_kind} "
                      "datasheet TDP ratio" if scale.cross_kind else ""))
    return out


def project(paths: list[str | Path], target: ProjectionTarget,
            command: list[str]) -> ProjectionFile:
    """Project ``target`` from the bundles at ``paths`` (module docstring).

    Raises:
        KitInputError: Unusable inputs, an impossible target, no run of the same model and
            platform, or no bandwidth figure for a collective the target needs.
    """
    table_paths = [Path(p) for p in paths if is_gemm_table(p)]
    tables = read_tables(table_paths)
    inputs = read_inputs([p for p in paths if not is_gemm_table(p)])
    platforms = {r.cfg.platform.name for r in inputs.runs}
    if len(platforms) > 1:
        raise KitInputError(f"runs of several platforms given ({', '.join(sorted(platforms))}): "
                            "a projection scales one platform's measurements")
    first = inputs.runs[0]
    platform = load_platform(target.platform) if target.platform else first.cfg.platform
    plan = plan_target(target, first.cfg.workload, platform)
    cfg = plan.cfg
    if cfg.optim.fsdp or cfg.parallel.moe_dispatcher != "alltoall":
        raise KitInputError("FSDP and the allgather MoE dispatcher are not modelled")
    runs = [r for r in inputs.runs if _same_model(r, cfg)]
    if not runs:
        raise KitInputError(
            f"no measured run of {cfg.workload.name}'s architecture (only its depth may "
            f"differ): given {', '.join(sorted({r.cfg.workload.name for r in inputs.runs}))}")
    graphed = _target_graphed(cfg)
    chosen = _choose(runs, cfg, graphed)
    optimizer_s, optimizer_from = _optimizer_s(chosen, runs)
    rates = SourceRates.of(chosen, optimizer_s)
    scale = kind_scale(chosen, cfg.platform, tables)
    links = _links(cfg, inputs, scale)
    try:
        step = _model_step(cfg, rates, links, _measured_overlap(chosen, cfg), graphed, scale)
    except ValueError as e:
        raise KitInputError(str(e)) from None
    lo, median, hi = chosen.step_s
    coupled = (coupling(chosen.step_samples_s, _draws(cfg, chosen))
               if not graphed and not chosen.graphed else Span.exact(1.0))
    if coupled.high > 1.0:
        # the slowest measured step bounds the high end: the third quartile is inside it
        step_s = _times(step.step_s, coupled).stretch(1 - lo / median, 0.0)
    else:
        step_s = step.step_s.stretch(1 - lo / median, hi / median - 1)
    step = StepModel(step_s, step.pipeline_s, step.bubble_s, step.bubble_frac_analytical,
                     step.stages, step.collectives)
    power = _power(chosen, inputs, cfg, step, scale)
    mem_gib = plan.memory.peak.total_bytes / GIB  # run --dry-run's "total per device"
    summary, interval = _summary(cfg, step_s, power, mem_gib)
    given = {Path(p).resolve(): str(p) for p in paths}

    return ProjectionFile(
        kit_version=kit.__version__, git_commit=kit.git_commit(),
        created_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=command, inputs=_inputs(given, inputs, chosen, optimizer_from)
        + _table_inputs(scale, given),
        config=cfg.model_dump(mode="json"), summary=summary, interval=interval,
        step={"pipeline_s": step.pipeline_s.as_list(), "bubble_s": step.bubble_s,
              "bubble_frac_analytical": step.bubble_frac_analytical,
              "micro_batches": cfg.grad_accum_steps, "graphed": graphed,
              "measured_step_s": list(chosen.step_s),
              "host_coupling": coupled.as_list(), **_bound(cfg, step)},
        stages=[_stage_record(s) for s in step.stages],
        collectives=[_collective_record(cfg, c) for c in step.collectives],
        power=None if power is None else {"compute_w": power.phases.compute_w,
                                          "comm_w": power.phases.comm_w,
                                          "idle_w": power.phases.idle_w},
        memory={"total_gib": mem_gib, "allocated_gib": plan.memory.peak.allocated_bytes / GIB,
                "fits": plan.memory.fits, "refusal": plan.refusal},
        assumptions=_assumptions(cfg, chosen, optimizer_from, links, power, graphed, scale)
        + _host_assumptions(cfg, chosen, graphed, coupled),
        notes=[f"layout {layout_label(cfg.model_dump(mode='json'))}"]
        + ([f"predicted not to fit: {plan.refusal}"] if plan.refusal else []),
        source_kind=scale.source_kind, provenance=_provenance(scale, links, power, chosen))


_COMPUTE_BOUND = ("MatMul", "attention", UNPROFILED)


def _times(a: Span, b: Span) -> Span:
    """End-wise product of two non-negative spans."""
    return Span(a.low * b.low, a.point * b.point, a.high * b.high)


def _draws(cfg: RunConfig, chosen: MeasuredRun) -> int:
    """How many of the measured run's steps a target step waits on.

    A measured step already is the slowest of its own ranks: the target's ranks count in groups
    of that many.
    """
    return max(1, cfg.world_size // chosen.cfg.world_size)


def _host_assumptions(cfg: RunConfig, chosen: MeasuredRun, graphed: bool,
                      coupled: Span) -> list[str]:
    """What an eager target's host adds (kit.projection.host), and what no input measures."""
    if graphed:
        return []
    p, out = cfg.parallel, []
    if p.pp > 1:
        out.append("eager pipeline: megatron-core synchronizes the device after every p2p call "
                   "(batch_p2p_sync): each call waits for up to one layer's device time of the "
                   "chunk before it (point: half of it)")
        if chosen.cfg.parallel.pp == 1 and not chosen.graphed:
            out.append("the host work of the embedding (first stage) and of the output layer "
                       "and loss (last stage) is measured spread over the layers of a run "
                       "without stages: the end stages' own share of it is not known (only "
                       "the logits' kernels are added to the last stage)")
    if coupled.high > 1.0:
        n = len(chosen.step_samples_s)
        k = _draws(cfg, chosen)
        out.append(f"{cfg.world_size} host-paced ranks wait on each other: the step lasts as "
                   f"long as the slowest of {k} draws (groups of the measured run's "
                   f"{chosen.cfg.world_size} rank(s)) from the {n} measured steps "
                   f"of {chosen.bundle.path.name} (x{coupled.point:.3g} its median; low: every "
                   f"host at the median; high: its slowest step, x{coupled.high:.3g})")
    elif chosen.graphed and cfg.world_size > 1:
        out.append("the measured step was one CUDA graph: no measured host pace to draw the "
                   "target's waits between ranks from (not in the interval)")
    src = chosen.cfg.parallel
    if (p.tp > 1 or p.cp > 1) and (src.tp, src.cp) != (p.tp, p.cp):
        out.append(f"eager TP{p.tp}/CP{p.cp} host work (the host issues every TP/SP/CP "
                   f"collective of every layer, and the ranks of a group wait on each other's "
                   f"hosts at each of them): not measured by any input ({chosen.bundle.path.name}"
                   f" ran TP{src.tp}/CP{src.cp}), not in the interval; an eager run of this TP "
                   "degree given as an input is chosen as the source")
    return out


def _bound(cfg: RunConfig, step: StepModel) -> dict[str, Any]:
    """What the slowest stage's step is spent on (point): tensor-core kernels (``compute``),
    memory-bound kernels and the optimizer (``memory``), exposed collectives (``link``) and the
    rest (``idle``: host gaps, bubble, waiting); ``bound`` is the largest of the first three."""
    m, total = cfg.grad_accum_steps, step.step_s.point
    slowest = max(step.stages, key=lambda s: m * s.micro_batch_s.point + s.tail_s.point)
    c = slowest.compute
    compute = m * sum(v for k, v in c.by_category.items() if k in _COMPUTE_BOUND)
    memory = m * sum(v for k, v in c.by_category.items() if k not in _COMPUTE_BOUND)
    memory += c.optimizer_s
    link = m * slowest.blocking_comm_s.point + slowest.tail_comm_s.point
    shares = {"compute": compute / total, "memory": memory / total, "link": link / total}
    shares["idle"] = max(0.0, 1 - sum(shares.values()))
    bound = max(("compute", "memory", "link"), key=lambda k: shares[k])
    return {"bound": bound, "bound_shares": shares, "bound_stage": slowest.stage}


def _links(cfg: RunConfig, inputs: Inputs, scale: KindScale) -> Links:
    """The target's fabric bundles; across kinds without one, the source kind's, borrowed
    (kit.projection.network)."""
    def of(kind: str) -> list[Any]:
        return [f for f, b in zip(inputs.fabrics, inputs.fabric_bundles, strict=True)
                if b.manifest.platform["name"] == kind]

    own, borrowed = of(cfg.platform.name), of(scale.source_kind)
    if own or not scale.cross_kind or not borrowed:
        return Links(cfg.platform, own)
    source = next(r.cfg.platform for r in inputs.runs if r.cfg.platform.name == scale.source_kind)
    return Links(cfg.platform, borrowed, borrowed_from=source)


def _power(chosen: MeasuredRun, inputs: Inputs, cfg: RunConfig, step: StepModel,
           scale: KindScale) -> PowerProjection | None:
    """Power on the target; across kinds scaled by the datasheet TDP ratio, None without it."""
    ratio = 1.0
    if scale.cross_kind:
        src, dst = datasheet(chosen.cfg.platform).tdp_w, datasheet(cfg.platform).tdp_w
        if src is None or dst is None:
            return None
        ratio = dst / src
    return project_power(chosen, inputs.comm_power_w, cfg, step, ratio)


def _table_inputs(scale: KindScale, given: dict[Path, str]) -> list[ProjectionInput]:
    """The GEMM tables, ``unused`` where the compute is not scaled by them (no table of the
    target, no profiled MatMul)."""
    used = scale.source_eff_tflops is not None and scale.target_table is not None
    out: list[ProjectionInput] = []
    for t in dict.fromkeys(x for x in (scale.source_table, scale.target_table) if x is not None):
        out.append(ProjectionInput(
            role="gemm" if used else "unused", bundle=t.path.name,
            path=given.get(t.path.resolve(), str(t.path)),
            sums_sha256=hashlib.sha256(t.path.read_bytes()).hexdigest(),
            what=f"GEMM table of {t.table.platform} ({t.table.device}, {t.table.dtype}, "
                 f"{len(t.table.points)} shapes, {t.table.created_utc})"))
    return out


def _provenance(scale: KindScale, links: Links, power: PowerProjection | None,
                chosen: MeasuredRun) -> dict[str, str]:
    out = dict(scale.provenance)
    if links.borrowed_from is not None:
        out["links"] = (f"measured fabric of {links.borrowed_from.name}, scaled by the datasheet "
                        f"intra-node ratio; low end: {links.platform.name} datasheet")
    elif links.has_measured_intra():
        out["links"] = f"measured fabric bundle of {links.platform.name}"
    else:
        out["links"] = f"datasheet: platform profile {links.platform.name} (lower bound)"
    if links.inter_measured():
        out["links"] += "; inter-node: measured multi-node fabric bundle"
    elif links.inter_gbps is None:
        out["links"] += "; inter-node: no figure (a group across nodes is refused)"
    else:
        out["links"] += f"; inter-node: datasheet {links.platform.name} (not measured)"
    if power is None:
        out["power"] = "not projected"
    elif scale.cross_kind:
        out["power"] = (f"measured on {scale.source_kind} ({chosen.bundle.path.name}) x the "
                        f"datasheet TDP ratio {power.scale:.3g}")
    else:
        out["power"] = f"measured bundle {chosen.bundle.path.name}"
    return out


def _stage_record(s: Any) -> StageRecord:
    return StageRecord(stage=s.stage, compute_s=s.compute.device_s,
                       compute_by_category_s=s.compute.by_category, idle_s=s.idle_s.as_list(),
                       blocking_comm_s=s.blocking_comm_s.as_list(),
                       micro_batch_s=s.micro_batch_s.as_list(),
                       p2p_sync_s=s.sync_s.as_list(), optimizer_s=s.compute.optimizer_s,
                       tail_s=s.tail_s.as_list())


def _collective_record(cfg: RunConfig, c: Any) -> CollectiveRecord:
    where = place(cfg, c.collective.group)
    k = c.collective
    return CollectiveRecord(stage=c.stage, what=k.what, op=k.op, group=k.group,
                            group_size=where.size, members_per_node=where.members_per_node,
                            nodes=where.nodes, size_bytes=k.size_bytes, calls=k.calls,
                            scope=k.scope, time_s=c.time_s.as_list(),
                            exposed_s=c.exposed_s.as_list())
