"""Platform profiles: what one node of a machine type offers, as declared in YAML."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kit.config.bounds import MAX_DEVICES_PER_NODE, MAX_GIB, MAX_RATE
from kit.config.workload import PlainText, ScalingRule

EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
"""An environment variable's name as a shell takes it after ``export``."""

Dtype = Literal["fp32", "bf16", "fp16"]


class Interconnect(BaseModel):
    """One link type, e.g. NVLink 4 inside a node or InfiniBand NDR between nodes."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="Link name, e.g. 'NVLink 4'.")
    scope: Literal["intra_node", "inter_node", "host"] = Field(description="What it connects.")
    bandwidth_gbps: float = Field(
        gt=0, le=MAX_RATE,
        description="Unidirectional GB/s (gigabytes) per device, as the vendor states it."
    )


class DevicePosition(BaseModel):
    """Where one device sits in the chassis, for thermal plots laid out like the hardware."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: int = Field(ge=0, lt=MAX_DEVICES_PER_NODE,
                        description="Local device index (CUDA/HIP ordinal).")
    slot: str = Field(description="Vendor's slot or package label, e.g. 'SXM3' or 'OAM1/GCD0'.")
    row: int = Field(ge=0, lt=MAX_DEVICES_PER_NODE,
                     description="Row in the chassis top view; 0 = front (cool air in).")
    col: int = Field(ge=0, lt=MAX_DEVICES_PER_NODE,
                     description="Column in the chassis top view; 0 = left.")


class StudyPace(BaseModel):
    """How fast ``charllm-kit study`` ran on this kind of node: seeds its time estimate
    (kit.study.estimate) until the node has bundles of its own study."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    startup_s: dict[Annotated[int, Field(gt=0, le=MAX_DEVICES_PER_NODE)],
                    Annotated[float, Field(gt=0, le=3600)]] = Field(
        min_length=1,
        description="Seconds per study point beyond its steps at the median step time (the "
        "launch, the first step's compilation and allocation, a CUDA graph's capture, writing "
        "the bundle), by the devices the study used; the nearest count stands for another.")
    mfu: float = Field(
        gt=0, le=1, description="Model-FLOPs utilization of the study's steps (median over its "
        "points), full recomputation's second forward pass counted as work.")
    source: str = Field(description="Where the numbers were measured: files, date, kit commit.")


class PlatformSpec(BaseModel):
    """One platform: a node type with its devices, peaks, links and telemetry sources."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: PlainText = Field(description="Unique name, equal to the YAML file's stem.")
    vendor: Literal["nvidia", "amd", "cpu"] = Field(description="Device vendor.")
    description: str = Field("", description="One line for `platforms list`.")
    device_name: str = Field(description="Marketing name of one device, e.g. 'H100 SXM5 80GB'.")
    detect_names: list[str] = Field(
        default_factory=list,
        description="Substrings of the driver-reported device name that identify this platform.",
    )
    devices_per_node: int | None = Field(
        None, gt=0, le=MAX_DEVICES_PER_NODE,
        description="Accelerators per node; null on cpu (ranks are processes)."
    )
    memory_per_device_gib: float | None = Field(
        None, gt=0, le=MAX_GIB,
        description="Device memory in GiB; null on cpu (host memory is shared)."
    )
    peak_tflops: dict[Dtype, Annotated[float, Field(gt=0, le=MAX_RATE)]] = Field(
        default_factory=dict,
        description="Dense peak TFLOP/s per device and dtype; MFU is null for a dtype not listed.",
    )
    dtype: Dtype = Field(description="Training dtype on this platform.")
    memory_bandwidth_gbps: float | None = Field(
        None, gt=0, le=MAX_RATE,
        description="Device memory bandwidth, GB/s, as the datasheet states it "
        "(projection across GPU kinds scales memory-bound kernels by its ratio).")
    tdp_w: float | None = Field(
        None, gt=0, le=MAX_RATE,
        description="Device power limit (TDP), W, as the datasheet states it "
        "(projection across GPU kinds scales the measured phase powers by its ratio).")
    interconnects: list[Interconnect] = Field(default_factory=list)
    comm_backend: Literal["gloo", "nccl", "rccl"] = Field(
        description="Collective library the ranks use (rccl: ROCm's, behind torch's nccl "
        "backend name).")
    env: dict[EnvName, PlainText] = Field(
        default_factory=dict,
        description="Environment every node's ranks get (the collective library's settings, "
        "e.g. NCCL_*/RCCL's HSA_*): exported by `submit`'s sbatch script, and set by the "
        "launcher where the environment does not already set them.")
    telemetry: list[str] = Field(
        description="Telemetry backends to try, in order of preference: registered sampler "
        "sources (kit.telemetry.SOURCES) or rank-side ones (zeus)."
    )
    replay_trace: str | None = Field(
        None,
        description="Recorded telemetry.parquet the `replay` backend feeds (absolute, or "
        "relative to the kit home); required when `telemetry` lists replay.",
    )
    rank_overhead_gib: float = Field(
        2.0, ge=0, le=MAX_GIB,
        description="Memory a rank needs beyond the tensors the model allocates, "
        "GiB: device context, loaded kernels, communicator buffers, allocator fragmentation "
        "(on cpu: the rank process itself).")
    multi_rank_margin_gib: float = Field(
        0.0, ge=0, le=MAX_GIB,
        description="How much more than the memory estimate a device of a multi-rank "
        "run was seen to need, against memory_per_device_gib, GiB: the collective library's "
        "communicator buffers beyond rank_overhead_gib (NCCL's grow with the communicators a "
        "layout opens), usable memory below the nominal, the estimate's own error. Not part of "
        "the refusal: a multi-rank run or dry run with less headroom gets a warning.")
    container_image: str | None = Field(None, description="Image that carries the kit for it.")
    chassis: list[DevicePosition] = Field(
        default_factory=list, description="Physical position of each local device."
    )
    chassis_assumed: bool = Field(
        True, description="Whether ``chassis`` is an assumption (a typical board's layout, "
        "not checked against this system's Module IDs and manual); figures then say the "
        "positions are assumed. Set false in a site profile whose layout was checked.")
    scaling: dict[str, ScalingRule] = Field(
        default_factory=dict,
        description="Workloads that do not fit this platform, by name, and how to scale them.",
    )
    study_pace: StudyPace | None = Field(
        None, description="Measured start-up and MFU of `charllm-kit study` on this kind of "
        "node, for its time estimate; null: the kit's defaults (docs/study.md).")

    @property
    def torch_backend(self) -> str:
        """The ``torch.distributed`` backend name for :attr:`comm_backend` (ROCm builds of
        torch serve RCCL as ``nccl``)."""
        return "nccl" if self.comm_backend == "rccl" else self.comm_backend

    @property
    def is_cpu(self) -> bool:
        """Whether ranks are plain CPU processes."""
        return self.vendor == "cpu"

    @model_validator(mode="after")
    def _check_devices(self) -> "PlatformSpec":
        from kit.config.telemetry_sources import known_sources

        unknown = [name for name in self.telemetry if name not in known_sources()]
        if unknown:
            raise ValueError(f"unknown telemetry backend(s) {unknown}; known: {known_sources()}")
        if ("replay" in self.telemetry) != (self.replay_trace is not None):
            raise ValueError("replay_trace is required exactly when telemetry lists replay")
        if self.vendor != "cpu" and self.devices_per_node is None:
            raise ValueError("devices_per_node is required for a GPU platform")
        if self.chassis and self.devices_per_node is not None:
            seen = sorted(p.device for p in self.chassis)
            if seen != list(range(self.devices_per_node)):
                raise ValueError(
                    f"chassis lists devices {seen}, expected 0..{self.devices_per_node - 1}"
                )
        return self
