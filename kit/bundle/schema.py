"""Result bundle v1: the files' schemas, with every field's meaning and unit.

A bundle is the one artifact a run leaves behind (docs/bundle-format.md):
``manifest.json`` (:class:`Manifest`), ``metrics.json`` (:class:`MetricsFile`),
``steps.parquet`` (:data:`STEPS_SCHEMA`), ``telemetry.parquet`` (:data:`TELEMETRY_SCHEMA`),
``experts.parquet`` (:data:`EXPERTS_SCHEMA`, mixture-of-experts runs only), optional
``profile/``, ``logs/rank<N>.log`` and ``SHA256SUMS``. A measurement the host cannot make is
``null`` with a reason, never ``0`` or ``-1``.
"""

from datetime import datetime, timedelta, timezone
from typing import Any, Literal, get_args

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kit.bundle.telemetry_fields import TELEMETRY_FIELDS, column

SCHEMA_VERSION = 1
"""Version of the layout below; readers refuse bundles with a newer one."""

Status = Literal["ok", "failed", "oom", "interrupted"]
STATUSES: tuple[str, ...] = get_args(Status)
"""How a run (or one rank) ended: ``ok``, an error, out of memory, or stopped by a signal."""

SUMMARY_FIELDS: dict[str, str] = {
    "step_time_s": "Median wall time of one measured optimizer step, seconds.",
    "tokens_per_s": "Tokens trained per second over the measured steps, whole job.",
    "tflops_per_gpu": "Achieved model TFLOP/s per device (Megatron-LM FLOP count), 1e12 FLOP/s.",
    "mfu": "Model FLOPs utilization, 0..1: tflops_per_gpu / the platform's dense dtype peak.",
    "energy_j_per_token": "Device energy over the measured steps per token, joules.",
    "power_w_mean": "Mean device power over the measured steps, averaged over devices, watts.",
    "power_w_peak": "Highest single device power sample during the measured steps, watts.",
    "temp_gpu_c_max": "Hottest device temperature sample during the measured steps, deg C.",
    "temp_gpu_c_spread": "Max minus min of per-device mean temperature, deg C.",
    "clock_sm_frac_of_max": "Mean SM clock over the measured steps / the device's max, 0..1.",
    "throttle_frac": "Fraction of device samples with any throttle bit set, 0..1.",
    "mem_peak_gib": "Peak device memory used by any rank, GiB (2**30 bytes).",
    "world_size": "Ranks in the job (an integer).",
}
"""``metrics.json`` summary keys and their meaning; always all present, ``null`` = unmeasurable."""

SUMMARY_KEYS: tuple[str, ...] = tuple(SUMMARY_FIELDS)

STEPS_SCHEMA = pa.schema(
    [
        column("step", pa.int32(), "Optimizer step index, from 0, warmup included.", False),
        column("rank", pa.int32(), "Global rank that timed the step.", False),
        column("phase", pa.string(), "'warmup' or 'measured'.", False),
        column("t_start", pa.float64(), "Step start, unix seconds, on node 0's clock (as t).",
               False),
        column("t_end", pa.float64(), "Step end, unix seconds, on node 0's clock (as t).", False),
        column("tokens", pa.int64(), "Tokens this rank's data-parallel replica consumed.", False),
        column("loss", pa.float64(), "Training loss; null on ranks that do not compute it."),
        column("stage", pa.int32(), "Pipeline stage of the rank (0 = first).", False),
        column("gpu_energy_j", pa.float64(), "Energy of the rank's GPU over the step (Zeus "
               "window on the hardware counter), joules; null when not measured."),
    ]
)
"""``steps.parquet``: one row per step per rank."""

EXPERTS_FILE = "experts.parquet"
EXPERTS_SCHEMA = pa.schema(
    [
        column("step", pa.int32(), "Optimizer step index, as in steps.parquet.", False),
        column("rank", pa.int32(), "Global rank whose router counted the tokens.", False),
        column("phase", pa.string(), "'warmup' or 'measured'.", False),
        column("layer", pa.int32(), "MoE layer number, 1-based over the whole model.", False),
        column("expert", pa.int32(), "Expert index within the layer, 0-based; under expert "
               "parallelism expert e lives on EP rank e // (experts / ep).", False),
        column("tokens", pa.int64(), "Tokens of this rank routed to the expert in the step, "
               "all micro-batches (each token counts once per expert of its top-k).", False),
    ]
)
"""``experts.parquet`` (MoE runs whose engine counts routing): one row per step per rank per
MoE layer per expert. Summed over the ranks that hold a layer, a step's rows give each
expert's load in that layer."""

def _utc_now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ClockSync(BaseModel):
    """A node's wall clock against node 0's, measured at the start and at the end of a run.

    Offsets are node 0's clock minus this node's, seconds; uncertainty is half the shortest
    round trip of the timestamp exchange (kit.launch.clock). Null where not measured (a node
    that died before the end).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    offset_start_s: float | None = Field(description="Offset before training, seconds.")
    uncertainty_start_s: float | None = Field(description="Its uncertainty, seconds.")
    offset_end_s: float | None = Field(description="Offset after training, seconds.")
    uncertainty_end_s: float | None = Field(description="Its uncertainty, seconds.")
    applied_s: float = Field(
        description="Seconds added to this node's step times and telemetry timestamps to put "
        "them on node 0's clock: the mean of the measured offsets.")


class NodeInventory(BaseModel):
    """What one node was: hardware and software versions. List position = node index."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(description="Hostname.")
    cpu: str = Field(description="CPU model name.")
    cpu_count: int = Field(gt=0, description="Logical CPUs.")
    memory_bytes: int = Field(gt=0, description="Host memory, bytes.")
    gpus: list[dict[str, Any]] = Field(
        description="One dict per device as its driver reports it (device, name, uuid, "
        "memory_total_bytes, power_limit_w, ...); empty on cpu."
    )
    driver: str | None = Field(description="GPU driver version; null without GPUs.")
    cuda: str | None = Field(description="CUDA runtime torch was built with; null if none.")
    rocm: str | None = Field(description="ROCm (HIP) version torch was built with; null if none.")
    python: str = Field(description="Python version.")
    torch: str | None = Field(description="torch version; null if not importable.")
    engine_versions: dict[str, str] = Field(
        description="Installed engine packages by name, e.g. {'megatron-core': '0.16.0'}."
    )
    network: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Network devices: one dict per interface (kind 'interface': name, "
        "speed_mbps, mtu, up) and per InfiniBand port (kind 'infiniband': name, port, state, "
        "rate, link_layer).")
    visible_devices: dict[str, str] = Field(
        default_factory=dict,
        description="The visible-device variables that were set (CUDA_VISIBLE_DEVICES, "
        "ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES): `gpus` lists the devices the ranks ran "
        "on, by their driver index, when they hid part of the node.")
    slurm_node: str | None = Field(
        None, description="Slurm node name (SLURMD_NODENAME) when run under Slurm; host names "
        "can be equal on every node of a test cluster, this is not.")
    clock: ClockSync | None = Field(
        None, description="This node's clock against node 0's; null on one-node runs.")


class FieldSource(BaseModel):
    """Which counter fed one canonical telemetry field, or why none did."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str | None = Field(description="Backend that fed it, e.g. 'nvml'; null when none did.")
    period_ms: float | None = Field(
        gt=0, description="Mean period between two rows holding a value of the field, "
        "milliseconds, on the device where it was longest, as the sampler measured it (fast "
        "fields: the ticks'; a slow counter: its own read period); where not measured, the "
        "sampling period or the slow counter's asked period.")
    reason: str | None = Field(description="Why the field is null (required when source is).")

    @model_validator(mode="after")
    def _reason_when_missing(self) -> "FieldSource":
        if self.source is None and not self.reason:
            raise ValueError("a field without a source needs a reason")
        return self


class RankRecord(BaseModel):
    """Where one rank ran, its place in the parallel layout and how it ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(ge=0, description="Global rank.")
    node: int = Field(ge=0, description="Node index (position in Manifest.inventory).")
    local_rank: int = Field(
        ge=0, description="Rank on its node; on GPUs it ran on the GPU at this position of its "
        "node's inventory `gpus` (the device index its runtime saw; that entry's `device` is the "
        "driver index).")
    stage: int = Field(ge=0, description="Pipeline stage whose layers it holds.")
    tp_rank: int = Field(ge=0, description="Tensor-parallel rank.")
    pp_rank: int = Field(ge=0, description="Pipeline-parallel rank.")
    dp_rank: int = Field(ge=0, description="Data-parallel rank.")
    cp_rank: int = Field(0, ge=0, description="Context-parallel rank.")
    ep_rank: int = Field(0, ge=0, description="Expert-parallel rank.")
    status: Status = Field(description="How this rank ended.")
    error: str | None = Field(description="This rank's error; null when ok.")
    exit_code: int | None = Field(
        None, description="Its process's exit code; null when a signal ended it or its end "
        "was not seen (a launcher that died).")
    signal: str | None = Field(
        None, description="Name of the signal that ended its process (e.g. SIGKILL), or null.")
    log_tail: list[str] = Field(
        default_factory=list, description="Last lines of its log when it did not end ok.")


class Redaction(BaseModel):
    """How ``bundle pack --redact`` rewrote a bundle for sharing (see kit.bundle.redact)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    redacted_utc: str = Field(description="When the bundle was redacted, ISO 8601 UTC.")
    removed: list[str] = Field(
        description="What was replaced, e.g. 'host names -> node<N>', 'IP addresses -> <ip>'."
    )
    replacements: int = Field(ge=0, description="Number of strings replaced over all files.")


class ContainerRecord(BaseModel):
    """The container a run ran in, so runs at different sites can be matched to one image.

    Filled in by kit.container.detect from what the kit's launcher passed (runtime, image,
    digest), what the runtime shows, and the variables docker/Dockerfile sets from its labels.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: str = Field(
        description="What ran the container: docker, podman, apptainer, pyxis (Slurm's enroot "
        "plugin), another engine as its `container` variable names it, or 'unknown' when only "
        "the image's own variables show that this is a container.")
    image: str | None = Field(
        description="The image as the runtime was given it (name:tag, a .sif or .sqsh path); "
        "null when nothing told the kit.")
    digest: str | None = Field(
        description="The image's content digest, 'sha256:<hex>': its image ID (the digest of "
        "its config, the same wherever the image is pushed or pulled) as the kit's launcher "
        "read it from docker or podman; null where nobody could tell.")
    flavour: str | None = Field(
        description="cpu, cuda or rocm: the image's label io.charllm-kit.flavour; null for an "
        "image that docker/build.sh did not build.")
    version: str | None = Field(
        description="charllm-kit version the image was built from "
        "(label org.opencontainers.image.version).")
    revision: str | None = Field(
        description="Source commit the image was built from, with '-dirty' when the checkout "
        "had uncommitted changes (label org.opencontainers.image.revision).")
    shm_bytes: int | None = Field(
        ge=0, description="Size of /dev/shm in the container, bytes (PyTorch's worker processes "
        "and NCCL's intra-node transport live there: kit.container.detect.SHM_MIN_BYTES); null "
        "when there is none.")


def _require_schema_version(schema: dict[str, Any]) -> None:
    """Mark ``schema_version`` required in the published JSON Schema: readers need it first."""
    schema["required"] = ["schema_version", *schema.get("required", [])]


class Manifest(BaseModel):
    """``manifest.json``: what ran, where, with which software, and how it ended."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, json_schema_extra=_require_schema_version
    )

    schema_version: int = Field(
        SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION,
        description="Layout version of the bundle; a reader refuses one newer than its own.",
    )
    kit_version: str = Field(description="charllm-kit version that wrote the bundle.")
    git_commit: str | None = Field(description="Kit source commit; null outside a checkout.")
    created_utc: str = Field(
        default_factory=_utc_now_iso, description="When the bundle was written, ISO 8601 UTC."
    )
    status: Status = Field(description="How the run ended.")
    error: str | None = Field(description="Why the run did not end ok; must be null when ok.")
    command: list[str] = Field(description="The command line that started the run (argv).")
    config: dict[str, Any] = Field(description="The resolved RunConfig, as JSON.")
    workload: dict[str, Any] = Field(
        description="The WorkloadSpec that trained, as JSON, plus 'scaling': the ScalingRecord "
        "(original, rule, platform) when a platform rule scaled it, else null."
    )
    platform: dict[str, Any] = Field(description="The PlatformSpec profile, as JSON.")
    inventory: list[NodeInventory] = Field(description="One entry per node, in node order.")
    telemetry_sources: dict[str, FieldSource] = Field(
        description="Canonical telemetry field -> the counter that fed it and its period.",
        json_schema_extra={"propertyNames": {"enum": list(TELEMETRY_FIELDS)}},
    )
    ranks: list[RankRecord] = Field(description="One entry per rank, in rank order.")
    redaction: Redaction | None = Field(
        None, description="Set when host names, user names and IPs were removed for sharing."
    )
    container: ContainerRecord | None = Field(
        None, description="The container the run ran in; null on a bare host, and in bundles "
        "written before the kit recorded it."
    )

    compile_cache: dict[str, Any] | None = Field(
        None, description="The compile cache the ranks used (kit.cache.compile_cache): dir, "
        "key (the versions and sources it is keyed by), warm (it held artifacts before the run), "
        "entries_before and entries_after (compiled artifacts in it), bytecode (the folder the "
        "ranks kept Python bytecode in where the installation keeps none, else null); null "
        "when the cache was off, and in "
        "bundles written before the kit recorded it."
    )
    slurm_job_id: str | None = Field(
        None, description="The Slurm job the run ran in (--launcher slurm); null outside "
        "Slurm, and in bundles written before the kit recorded it. A batch job's script is "
        "job/sbatch.sh in the bundle."
    )

    @field_validator("created_utc")
    @classmethod
    def _check_utc(cls, value: str) -> str:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if parsed.utcoffset() != timedelta(0):
            raise ValueError("must be UTC (end in Z or +00:00)")
        return value

    @field_validator("workload", "platform")
    @classmethod
    def _check_named(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(value.get("name"), str):
            raise ValueError("must carry a string 'name'")
        return value

    @field_validator("workload")
    @classmethod
    def _check_scaling(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(value.get("scaling", ...), dict | None):
            raise ValueError("must carry 'scaling': an object or null")
        return value

    @field_validator("telemetry_sources")
    @classmethod
    def _check_fields(cls, value: dict[str, FieldSource]) -> dict[str, FieldSource]:
        unknown = sorted(set(value) - set(TELEMETRY_FIELDS))
        if unknown:
            raise ValueError(f"unknown telemetry fields {unknown}")
        return value

    @model_validator(mode="after")
    def _no_error_when_ok(self) -> "Manifest":
        # The converse is not enforced: a failed run's bundle must be written even when no
        # rank reported why.
        if self.status == "ok" and self.error is not None:
            raise ValueError("error must be null when status is ok")
        return self


class MetricsFile(BaseModel):
    """``metrics.json``: the summary every comparison uses, and its per-rank/device detail."""

    # NaN or infinity is a bug upstream: refuse it rather than let it pass as null.
    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, ser_json_inf_nan="constants"
    )

    summary: dict[str, float | int | None] = Field(
        description="Exactly SUMMARY_KEYS (see SUMMARY_FIELDS for units); null = unmeasurable.",
        json_schema_extra={
            "properties": {
                k: {"type": ["number", "null"], "description": d} for k, d in SUMMARY_FIELDS.items()
            },
            "required": list(SUMMARY_KEYS),
            "additionalProperties": False,
        },
    )
    per_rank: list[dict[str, Any]] = Field(
        default_factory=list, description="One dict per rank: 'rank', 'stage' and its metrics."
    )
    per_device: list[dict[str, Any]] = Field(
        default_factory=list, description="One dict per device: 'node', 'device' and its metrics."
    )
    power: dict[str, Any] = Field(
        default_factory=dict,
        description="Job-level power/thermal detail beyond the summary (kit.metrics.power): "
        "energy_j and its source, energy_j_per_step, peak_to_mean (worst device), excursions "
        "above excursion_frac x power limit (count, seconds), throttle_frac_by_reason; the "
        "energy cross-checks (power_integral_j, counter_vs_integral, zeus_energy_j, "
        "zeus_vs_counter, energy_check_max) and what the figures rest on (power_samples_min, "
        "counter_readings_min, counter_coverage_min, window_s, window_short, temp_steady, "
        "energy_steps: the measured steps the energy covers), docs/metrics.md.",
    )
    lifecycle: dict[str, Any] = Field(
        default_factory=dict,
        description="Where start-up and teardown spent their time (kit.lifecycle): "
        "launch_to_first_step_s (launcher start to the first step's start), "
        "launch_to_first_step_end_s, last_step_to_assembly_s (the last rank's last step to the "
        "start of the bundle's assembly), phases_s (seconds per phase: launcher, rank_imports, "
        "engine_imports, process_groups, model_build, first_step; rank_exit, ranks_reaped, "
        "sampler_stop, bundle_start; ranks' phases at the slowest rank), setup_s (time the "
        "launcher's process spent before the kit started, e.g. run.sh's set-up; not part of "
        "launch_to_first_step_s; absent when none). Empty for a recovered run.")
    stragglers: dict[str, Any] = Field(
        default_factory=dict,
        description="Per step each rank's compute time and its wait for the slowest rank of its "
        "pipeline stage, summarized (kit.metrics.stragglers, docs/metrics.md): the rank that "
        "held its stage up longest (slowest_rank, stage, ranks_compared), how often "
        "(slowest_frac, 0..1), by how much (lag_s_median, lag_s_p90 seconds; lag_frac_median "
        "of the other ranks' median compute), its GPU's temp_gpu_c and clock_sm_mhz over those "
        "steps beside the stage's other devices (others_*), per_rank figures, and reason "
        "when not measured (every figure null). Empty in bundles written before the kit "
        "measured stragglers.")
    expert_load: dict[str, Any] = Field(
        default_factory=dict,
        description="Load balance of a mixture-of-experts run's routing over the measured "
        "steps (kit.metrics.expert_load, docs/metrics.md), from experts.parquet: experts, "
        "layers, top_k, measured_steps; max_over_mean (busiest expert's tokens / the mean "
        "expert's, per step and layer, averaged over them) and max_over_mean_worst (their "
        "max); cv and cv_worst (coefficient of variation of tokens per expert, likewise); ep, "
        "ep_max_over_mean and ep_max_over_mean_worst (max/mean of the tokens each expert-"
        "parallel rank receives; null at ep 1); per_layer (layer, max_over_mean, cv, "
        "tokens_frac: each expert's share of the layer's tokens over the measured steps); "
        "dropped_frac, dropped_frac_worst and dropped_frac_by_step ([step, share]: the share "
        "of routed token slots an expert at capacity dropped, mean over layers; 0 dropless). "
        "Empty for dense runs and bundles written before the kit counted routing.")
    execution: dict[str, Any] = Field(
        default_factory=dict,
        description="How the training step executed (kit.engines.execution, "
        "docs/bundle-format.md): mode ('graphed': each step's forward and backward replayed "
        "from one captured CUDA graph; 'eager': launched kernel by kernel from Python) and "
        "eager_because (what kept "
        "it eager, one phrase each; empty when graphed). Empty for a fabric run (it trains "
        "nothing) and in bundles written before the kit recorded it, whose notes tell the "
        "mode instead ('speed features: ...', 'cuda_graph off: ... keep(s) the eager step').")
    notes: list[str] = Field(
        default_factory=list, description="How metrics were derived, e.g. energy from power."
    )
    samplers: list[dict[str, Any]] = Field(
        default_factory=list,
        description="One dict per node's telemetry sampler (kit.launch.assemble.sampler_record):"
        " node, complete (false: the sampler was killed, and the rest is what it reported after "
        "its first tick), cpu_s (CPU time of the sampler process, user + system over all its "
        "threads, seconds: its cost to the node), wall_s, cpu_cores (cpu_s / wall_s: the "
        "share of one core it used), ticks, missed_ticks, missed_tick_frac (missed / (ticks + "
        "missed)), mean_period_ms (between ticks), rows_written, and over the measured phase "
        "only (between the pokes at its edges; null without them): measured_cpu_cores, "
        "measured_wall_s, measured_missed_tick_frac; empty without telemetry, and in bundles "
        "written before the kit recorded it.",
    )

    @field_validator("summary")
    @classmethod
    def _check_keys(cls, value: dict[str, float | int | None]) -> dict[str, float | int | None]:
        missing = [k for k in SUMMARY_KEYS if k not in value]
        extra = sorted(set(value) - set(SUMMARY_KEYS))
        if missing or extra:
            raise ValueError(f"summary keys missing {missing}, unknown {extra}")
        return value
