"""The resolved, validated configuration of one run: workload x platform x parallel layout."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kit.config.bounds import MAX_STEPS
from kit.config.fabric import FabricSpec
from kit.config.platform import Dtype, PlatformSpec
from kit.config.workload import ScalingRecord, WorkloadSpec

Recompute = Literal["none", "selective", "full"]
RecomputeMethod = Literal["uniform", "block"]
Launcher = Literal["local", "torchrun", "slurm"]


class ParallelConfig(BaseModel):
    """Parallel degrees with megatron-core's semantics.

    World size = tp x pp x cp x dp. Expert parallelism does not add ranks: experts are sharded
    inside the data-parallel (x context-parallel) group, so ``ep`` divides ``dp * cp``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int = Field(1, gt=0, description="Tensor-parallel degree.")
    pp: int = Field(1, gt=0, description="Pipeline-parallel degree (stages).")
    dp: int = Field(1, gt=0, description="Data-parallel degree (derived when not given).")
    cp: int = Field(1, gt=0, description="Context-parallel degree.")
    ep: int = Field(1, gt=0, description="Expert-parallel degree (MoE only).")
    vpp: int | None = Field(None, gt=0, description="Virtual stages per pipeline rank; null = off.")
    sp: bool = Field(False, description="Sequence parallelism (needs tp > 1).")
    moe_dispatcher: Literal["alltoall", "allgather"] = Field(
        "alltoall", description="megatron-core MoE token dispatcher (MoE workloads only)."
    )

    @property
    def world_size(self) -> int:
        """Ranks needed by this layout."""
        return self.tp * self.pp * self.cp * self.dp


class OptimizationConfig(BaseModel):
    """Memory/communication optimizations the reference study varied."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recompute: Recompute = Field("none", description="Activation recomputation granularity.")
    recompute_method: RecomputeMethod = Field(
        "uniform", description="Full recompute: 'uniform' checkpoints every layer's input, "
        "'block' only the first layer of each pipeline stage (megatron's recompute_method)."
    )
    overlap: bool = Field(False, description="Overlap grad reduce / param gather with compute.")
    dist_optimizer: bool = Field(False, description="Shard optimizer states across DP ranks.")
    fsdp: bool = Field(False, description="megatron-core's fully sharded data parallel.")
    zero: Literal[0, 1, 2, 3] = Field(0, description="DeepSpeed ZeRO stage (deepspeed engine).")
    offload: bool = Field(
        False,
        description="Keep optimizer states and run the optimizer step in host memory "
        "(DeepSpeed ZeRO-Offload; needs zero >= 1).",
    )


class RunConfig(BaseModel):
    """Everything a launcher, an engine and the bundle need to know about one run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadSpec | FabricSpec = Field(
        discriminator="family",
        description="The architecture that actually trains; for `charllm-kit fabric` the "
        "collectives and sizes it measures (family: fabric, no model).")
    scaling: ScalingRecord | None = Field(
        None, description="Set when the platform scaled the workload: original, rule, platform."
    )
    platform: PlatformSpec
    engine: str = Field("megatron", description="Registered engine name (kit.engines).")
    launcher: Launcher = Field(
        "local", description="How ranks started: local (one node), torchrun or slurm (a node "
        "agent per node, torch's elastic agent starting its ranks).")
    nodes: int = Field(1, gt=0, description="Nodes; world size = nodes x devices per node.")
    devices_per_node: int | None = Field(
        None, gt=0,
        description="Devices used per node: the profile's, or fewer when a real run finds fewer "
        "on the host; null on cpu (ranks are processes).",
    )
    parallel: ParallelConfig
    optim: OptimizationConfig
    micro_batch_size: int = Field(gt=0, description="Samples per micro-batch per DP rank.")
    global_batch_size: int = Field(gt=0, description="Samples per optimizer step.")
    dtype: Dtype = Field(description="Training dtype (bf16 on GPUs, fp32 on CPU).")
    steps: int = Field(gt=0, le=MAX_STEPS, description="Measured steps (after warmup).")
    warmup: int = Field(ge=0, le=MAX_STEPS,
                        description="Unmeasured steps before measurement starts.")
    telemetry_interval_ms: int = Field(
        ge=0, description="Telemetry sampling period, milliseconds; 0 turns telemetry off."
    )
    min_measured_s: float = Field(
        0.0, ge=0, description="Least seconds of measured steps: rank 0 asks for more measured "
        "steps (all ranks agree at each step's start) until the measured phase lasts this "
        "long, at most MAX_EXTENSION x steps in all (kit.measure_window).")
    profile: bool = Field(
        False, description="Record a kernel profile (torch.profiler/Kineto) of the profiled "
        "steps on the profiled ranks, and its breakdown (kit.launch.profiling).")
    profile_steps: tuple[int, int] | None = Field(
        None, description="Profiled steps as a half-open range [A, B) of step numbers (0 = "
        "the first warmup step); null = the last warmup step (step 0 without warmup).")
    profile_ranks: tuple[int, ...] | None = Field(
        None, description="Ranks that profile; null = every rank.")
    chakra: bool = Field(
        False, description="Record PyTorch's execution trace with the Kineto trace and convert "
        "both into Chakra ETs when the chakra package is installed (kit.interop.chakra).")
    seed: int = Field(1234, description="Seed for weights and synthetic tokens.")
    lr: float = Field(3e-4, gt=0, description="AdamW learning rate (constant).")
    speed: list[str] | None = Field(
        None, description="The engine's GPU speed features; null = the platform's default set.")
    eager: bool = Field(
        False, description="megatron: the step stays eager although its layout could be one "
        "CUDA graph (kit.engines.megatron.features.graph_blockers).")
    phase_timers: bool = Field(True, description="megatron: per-phase step timers on.")
    stall_timeout_s: float | None = Field(
        None, ge=0, description="Seconds without any rank finishing a step before the stall "
        "watchdog ends the run (kit.launch.watchdog); null = max(20 x median step, 120 s), "
        "0 = off.")

    @property
    def world_size(self) -> int:
        """Total ranks."""
        return self.parallel.world_size

    @property
    def ranks_per_node(self) -> int:
        """Ranks each node starts: its devices, or on cpu the world split over the nodes."""
        return self.devices_per_node or self.world_size // self.nodes

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per optimizer step on each DP rank."""
        return self.global_batch_size // (self.micro_batch_size * self.parallel.dp)

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed by one optimizer step across all ranks (0 for a fabric run)."""
        if isinstance(self.workload, FabricSpec):
            return 0
        return self.global_batch_size * self.workload.seq_length

    @property
    def total_steps(self) -> int:
        """Warmup plus measured steps."""
        return self.warmup + self.steps

    @property
    def max_total_steps(self) -> int:
        """The most steps a rank may run: the measured phase may extend itself
        (``min_measured_s``, :data:`kit.measure_window.MAX_EXTENSION`)."""
        from kit.measure_window import MAX_EXTENSION

        return self.warmup + self.steps * (MAX_EXTENSION if self.min_measured_s > 0 else 1)
