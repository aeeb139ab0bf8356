"""Turn a workload name, a platform and the user's overrides into one validated RunConfig."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kit.config.bounds import MAX_BATCH, MAX_RANKS, MAX_SECONDS, MAX_STEPS
from kit.config.loader import describe_validation_error, load_platform, load_workload
from kit.config.platform import PlatformSpec
from kit.config.run import (
    Launcher,
    OptimizationConfig,
    ParallelConfig,
    Recompute,
    RecomputeMethod,
    RunConfig,
)
from kit.config.validate import layout_violations
from kit.config.workload import ScalingRecord, WorkloadSpec
from kit.errors import KitInputError
from kit.measure_window import default_min_measured_s
from kit.plan.detect import detect_platform, platform_present
from kit.telemetry.devices import local_accelerator_names


class RunRequest(BaseModel):
    """What a user asked for: the one definition of a run's options.

    ``charllm-kit run`` generates its options from these fields (kit/cli/options.py: the name is
    ``--field-name`` unless ``cli`` says otherwise, the help is the description), and a sweep's
    ``base:`` and axes use the field names. ``None`` (or leaving a field out) means "the
    default for this workload and platform". Options that only one engine takes are named by its
    :class:`~kit.engines.registry.EngineSpec` and refused for the others.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    workload: str = Field(description="Workload name (workloads/) or a workload YAML file.")
    platform: str | None = Field(
        None, description="Platform name or YAML file (default: detect this host).")
    engine: str = Field(
        "megatron", description="Training engine: a registered name (kit/engines: megatron, "
        "deepspeed, fsdp2).")
    launcher: Launcher = Field(
        "local", description="How ranks start: local (this node only), torchrun (run the same "
        "command on every node with --node-rank and --rdzv-endpoint), slurm (inside an "
        "allocation: one node agent per node through srun). See docs/multi-node.md.")
    nodes: int = Field(
        1, gt=0, le=MAX_RANKS,
        description="Nodes; more than one needs --launcher torchrun or slurm.")
    node_rank: int | None = Field(
        None, ge=0, le=MAX_RANKS,
        description="torchrun: this node's index, 0 .. nodes-1 (node 0 hosts the "
        "rendezvous and publishes the bundle).")
    rdzv_endpoint: str | None = Field(
        None, description="torchrun: HOST:PORT of node 0's rendezvous store, the same on "
        "every node.")
    rdzv_timeout: int = Field(
        300, gt=0, le=MAX_SECONDS,
        description="Seconds every node may take to join the rendezvous (and to "
        "report at the end) before the run stops with an error naming the missing node.")
    tp: int = Field(1, gt=0, le=MAX_RANKS, description="Tensor-parallel degree.")
    pp: int = Field(1, gt=0, le=MAX_RANKS, description="Pipeline-parallel degree (stages).")
    dp: int | None = Field(
        None, gt=0, le=MAX_RANKS,
        description="Data-parallel degree (default: what fills the devices).")
    cp: int = Field(1, gt=0, le=MAX_RANKS, description="Context-parallel degree.")
    ep: int = Field(1, gt=0, le=MAX_RANKS, description="Expert-parallel degree (MoE workloads).")
    vpp: int | None = Field(
        None, gt=0, le=MAX_RANKS,
        description="Virtual pipeline stages per pipeline rank (default: off).")
    sp: bool = Field(False, description="Sequence parallelism (needs --tp > 1).")
    moe_dispatcher: Literal["alltoall", "allgather"] = Field(
        "alltoall", description="MoE token dispatcher.")
    moe_capacity: str | None = Field(
        None, description="MoE expert capacity factor, each expert's input padded to it (the "
        "reference study's 1.0), or none for dropless routing (default: the workload's).",
        json_schema_extra={"cli": "--moe-capacity"})
    micro_batch_size: int | None = Field(
        None, gt=0, le=MAX_BATCH, description="Samples per micro-batch (default: the workload's).",
        json_schema_extra={"cli": "--micro-batch"})
    global_batch_size: int | None = Field(
        None, gt=0, le=MAX_BATCH,
        description="Samples per optimizer step (default: the workload's).",
        json_schema_extra={"cli": "--global-batch"})
    recompute: Recompute = Field("none", description="Activation recomputation granularity.")
    recompute_method: RecomputeMethod = Field(
        "uniform", description="Which layers full recompute checkpoints.")
    overlap: bool = Field(
        False, description="Overlap gradient reduce / parameter gather with compute.")
    dist_optimizer: bool = Field(
        False, description="megatron: shard optimizer states over data parallelism.")
    fsdp: bool = Field(
        False, description="megatron: Megatron-FSDP, shard weights, grads and optimizer over DP.")
    zero: Literal[0, 1, 2, 3] = Field(0, description="deepspeed: ZeRO stage.")
    offload: bool = Field(
        False, description="deepspeed: optimizer states and step on the host (ZeRO-Offload).")
    steps: int = Field(20, gt=0, le=MAX_STEPS, description="Measured steps.")
    warmup: int = Field(3, ge=0, le=MAX_STEPS, description="Unmeasured steps first.")
    telemetry_interval_ms: int = Field(
        20, ge=0, le=MAX_SECONDS * 1000,
        description="Telemetry sampling period in ms; 0 turns telemetry off.")
    min_measured_s: float | None = Field(
        None, ge=0, le=MAX_SECONDS,
        description="Least seconds of measured steps: a run whose --steps end "
        "sooner runs more measured steps until then (saying so), at most 20 x --steps, so its "
        "power peaks and energy rest on enough samples (docs/metrics.md). Default: 100 "
        "telemetry periods or 4 s, whichever is longer, where devices are sampled; 0 on a "
        "CPU host or with telemetry off.")
    profile: bool = Field(
        False, description="Record a kernel profile and its per-rank breakdown "
        "(docs/profiling.md).")
    profile_steps: str | None = Field(
        None, pattern=r"^\d+(:\d+)?$",
        description="Steps to profile, A:B over step numbers as in steps.parquet (0 = the first "
        "warmup step): A up to B-1, like a Python range; A alone is one step. Default: the last "
        "warmup step (step 0 without warmup). Implies --profile.",
        json_schema_extra={"form": "A:B or A (step numbers, e.g. 2:4)"})
    profile_ranks: str | None = Field(
        None, pattern=r"^\d+(,\d+)*$",
        description="Ranks that profile, comma-separated (e.g. 0,3); default: every rank. "
        "Implies --profile.", json_schema_extra={"form": "R or R,R,... (ranks, e.g. 0,3)"})
    chakra: bool = Field(
        False, description="With the Kineto trace, record PyTorch's execution trace of the "
        "profiled steps and, when MLCommons Chakra is installed, link and convert both into "
        "Chakra ETs in the bundle (profile/chakra/). Implies --profile.")
    seed: int = Field(1234, ge=0, le=2**32 - 1,
                      description="Seed for weights and synthetic tokens.")
    speed: str | None = Field(
        None, description="GPU speed features, comma-separated, or none (default: those "
        "measured to pay on the platform). megatron: fusions, wgrad_fusion, cross_entropy, "
        "cuda_graph, fused_adam, foreach_optim, compile, grouped_gemm, sync_free_permute, "
        "graph_pipeline; "
        "deepspeed and fsdp2: compile, cross_entropy.")
    eager: bool = Field(
        False, description="megatron: run every step eagerly, no CUDA graph, where the layout "
        "could be graphed (to compare it with a layout that cannot be: docs/study.md).")
    phase_timers: bool = Field(
        True, description="megatron: time each step's forward, backward, pipeline p2p, grad "
        "sync and optimizer (off: measure the step without the timers' synchronizations).")
    stall_timeout_s: float | None = Field(
        None, ge=0, le=MAX_SECONDS,
        description="End the run as failed, naming the ranks that stopped, when no "
        "rank finishes a step for this many seconds (after each rank's first step; before it "
        "900 s, or this when larger). Default: 20 x the median step, at least 120 s; 0 = off.")


def _with_moe_capacity(workload: WorkloadSpec, capacity: str | None) -> WorkloadSpec:
    """``workload`` with ``--moe-capacity`` applied: ``none`` is dropless, a number that
    capacity factor with every expert's input padded to it.

    Raises:
        KitInputError: The workload is dense, or the value is neither ``none`` nor a number
            in (0, 64].
    """
    if capacity is None:
        return workload
    if not workload.is_moe:
        raise KitInputError(f"--moe-capacity: {workload.name} is not a mixture-of-experts "
                            "workload")
    if capacity.strip().lower() == "none":
        return workload.model_copy(update={"moe_capacity_factor": None,
                                           "moe_pad_to_capacity": False})
    try:
        factor = float(capacity)
    except ValueError:
        factor = float("nan")
    if not 0 < factor <= 64:  # also refuses nan and inf
        raise KitInputError(f"--moe-capacity: {capacity!r} is neither none nor a capacity "
                            "factor in (0, 64]")
    return workload.model_copy(update={"moe_capacity_factor": factor,
                                       "moe_pad_to_capacity": True})


def apply_scaling(
    workload: WorkloadSpec, platform: PlatformSpec
) -> tuple[WorkloadSpec, ScalingRecord | None]:
    """Scale ``workload`` by ``platform``'s declared rule for it, recording the provenance."""
    rule = platform.scaling.get(workload.name)
    if rule is None:
        return workload, None
    data = workload.model_dump()
    unknown = set(rule.set) - set(data)
    if unknown:
        raise KitInputError(
            f"platform {platform.name}: scaling rule for {workload.name} sets unknown fields "
            f"{sorted(unknown)}"
        )
    data.update(rule.set)
    data["name"] = f"{workload.name}@{platform.name}"
    data["description"] = f"{workload.description} (scaled for {platform.name}: {rule.reason})"
    try:
        scaled = WorkloadSpec.model_validate(data)
    except ValidationError as e:
        raise KitInputError(
            f"platform {platform.name}: scaling rule for {workload.name} gives an invalid "
            f"architecture: {describe_validation_error(e)}"
        ) from None
    return scaled, ScalingRecord(original=workload, rule=rule, platform=platform.name)


def _data_parallel(req: RunRequest, platform: PlatformSpec, per_node: int | None) -> int:
    model_ranks = req.tp * req.pp * req.cp
    if per_node is None:  # cpu: the world is whatever the degrees ask for, split over the nodes
        dp = req.dp or 1
        if (model_ranks * dp) % req.nodes:
            raise KitInputError(
                f"tp x pp x cp x dp ({model_ranks * dp}) ranks cannot be split evenly over "
                f"--nodes {req.nodes}; change --dp or --nodes")
        return dp
    world = req.nodes * per_node
    if req.nodes == 1 and req.dp is not None:
        # Part of one node: the layout's ranks run on the first of its (visible) devices.
        if model_ranks * req.dp > per_node:
            raise KitInputError(
                f"tp x pp x cp x dp = {model_ranks * req.dp} ranks need as many devices; "
                f"this node has {per_node} {platform.name} device(s)")
        return req.dp
    if world % model_ranks:
        raise KitInputError(
            f"tp x pp x cp ({model_ranks}) must divide the world size {world} "
            f"({req.nodes} node(s) x {per_node} {platform.name} devices)"
        )
    derived = world // model_ranks
    if req.dp is not None and req.dp != derived:
        raise KitInputError(
            f"--dp {req.dp} does not fill {world} devices of {req.nodes} nodes with "
            f"tp x pp x cp = {model_ranks}; use --dp {derived} or leave it out (only a "
            "one-node run may use part of its node)"
        )
    return derived


def _step_range(text: str | None, total_steps: int) -> tuple[int, int] | None:
    """``A:B`` (or ``A``) as the half-open step range ``(A, B)``, checked against the run."""
    if text is None:
        return None
    first, _, stop = text.partition(":")
    start, end = int(first), int(stop) if stop else int(first) + 1
    if not start < end <= total_steps:
        raise KitInputError(
            f"--profile-steps {text}: need A < B <= {total_steps} (warmup + measured steps; "
            "steps count from 0, A:B profiles A up to B-1)"
        )
    return start, end


def _rank_list(text: str | None) -> tuple[int, ...] | None:
    """``0,3`` as sorted distinct ranks (checked against the world size once it is known)."""
    return None if text is None else tuple(sorted({int(r) for r in text.split(",")}))


def run_request(**fields: object) -> RunRequest:
    """Build a :class:`RunRequest`, turning a validation failure into one-line bad input."""
    try:
        return RunRequest(**fields)  # type: ignore[arg-type]
    except ValidationError as e:
        raise KitInputError(f"invalid run fields: {describe_validation_error(e)}") from None


def resolve(req: RunRequest, require_present: bool = False) -> RunConfig:
    """Resolve and validate ``req``; raise :class:`KitInputError` listing every violation.

    With ``require_present`` the platform's devices must be on this host (a real run);
    a dry run resolves any platform without its hardware.
    """
    platform = load_platform(req.platform) if req.platform else detect_platform()
    if require_present and not platform_present(platform):
        raise KitInputError(
            f"platform {platform.name} ({platform.device_name}) is not present on this host; "
            "use --dry-run to resolve it here, or --platform cpu"
        )
    if require_present and req.launcher == "local" and req.nodes > 1:
        raise KitInputError(
            f"--nodes {req.nodes} needs --launcher torchrun (with --node-rank and "
            "--rdzv-endpoint on every node) or --launcher slurm (inside an allocation); "
            "--dry-run resolves the layout")
    per_node = platform.devices_per_node
    if require_present and per_node is not None:
        # A host with fewer devices than the profile's full node (a 1-GPU workstation, a
        # partial allocation, devices hidden by CUDA_VISIBLE_DEVICES and the like) runs on
        # the devices it has; the config records how many.
        per_node = min(per_node, len(local_accelerator_names())) or per_node
    dp = _data_parallel(req, platform, per_node)
    if per_node is not None and req.nodes == 1:
        per_node = min(per_node, req.tp * req.pp * req.cp * dp)
    original = load_workload(req.workload)
    workload, scaling = apply_scaling(_with_moe_capacity(original, req.moe_capacity), platform)
    cfg = RunConfig(
        workload=workload,
        scaling=scaling,
        platform=platform,
        engine=req.engine,
        launcher=req.launcher,
        nodes=req.nodes,
        devices_per_node=per_node,
        parallel=ParallelConfig(
            tp=req.tp, pp=req.pp, dp=dp, cp=req.cp, ep=req.ep,
            vpp=req.vpp, sp=req.sp, moe_dispatcher=req.moe_dispatcher,
        ),
        optim=OptimizationConfig(
            recompute=req.recompute, overlap=req.overlap, dist_optimizer=req.dist_optimizer,
            fsdp=req.fsdp, zero=req.zero, offload=req.offload,
            recompute_method=req.recompute_method,
        ),
        micro_batch_size=req.micro_batch_size or workload.micro_batch_size,
        global_batch_size=req.global_batch_size or workload.global_batch_size,
        dtype=platform.dtype,
        steps=req.steps,
        warmup=req.warmup,
        telemetry_interval_ms=req.telemetry_interval_ms,
        min_measured_s=(req.min_measured_s if req.min_measured_s is not None
                        else default_min_measured_s(req.telemetry_interval_ms,
                                                    not platform.is_cpu)),
        profile=req.profile or bool(req.profile_steps or req.profile_ranks) or req.chakra,
        profile_steps=_step_range(req.profile_steps, req.warmup + req.steps),
        profile_ranks=_rank_list(req.profile_ranks),
        chakra=req.chakra,
        seed=req.seed,
        speed=None if req.speed is None else [f for f in req.speed.split(",")
                                              if f.strip() and f.strip() != "none"],
        eager=req.eager,
        phase_timers=req.phase_timers,
        stall_timeout_s=req.stall_timeout_s,
    )
    from kit.engines import engine_spec, foreign_options

    engine = engine_spec(req.engine)
    problems = foreign_options(req.engine, req.model_dump(exclude_defaults=True))
    problems += layout_violations(cfg)
    problems += [f"--profile-ranks: rank {r} is not in a world of {cfg.world_size}"
                 for r in cfg.profile_ranks or () if r >= cfg.world_size]
    if not problems:
        problems = engine.violations(cfg)
    if not problems and require_present:
        problems = engine.missing()
    if problems:
        raise KitInputError("; ".join(problems))
    return cfg
