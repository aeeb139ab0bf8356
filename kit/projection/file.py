"""The projected-bundle file: one JSON document that ``compare`` and ``report`` read beside
measured bundles, always marked as projected and naming the bundles it was projected from.

Its name ends in :data:`SUFFIX`. It carries the target's resolved config, the same ``summary``
keys as a bundle's ``metrics.json`` (figures a projection does not make, such as temperatures,
are null), each projected figure's interval ``[low, point, high]``, the model's parts (stages,
collectives, phase powers), its assumptions and its inputs, each with the SHA-256 of the
input's ``SHA256SUMS`` (which pins every file of it). :func:`projected_bundle` turns it into a
:class:`~kit.bundle.reader.Bundle` whose ``projection`` is set, so the comparison code that
reads manifests and metrics needs no second path; it has no telemetry, steps or profile.
"""

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kit.bundle.reader import Bundle
from kit.bundle.schema import SUMMARY_KEYS, FieldSource, Manifest, MetricsFile, RankRecord
from kit.config.loader import describe_validation_error
from kit.errors import BundleError

SUFFIX = ".projection.json"
KIND = "charllm-kit projection"
VERSION = 1
Triple = list[float]
"""``[low, point, high]`` (kit.projection.span)."""


class ProjectionInput(BaseModel):
    """One bundle the projection read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["compute", "optimizer", "fabric", "gemm", "unused"] = Field(
        description="compute: the run whose breakdown and power were scaled; optimizer: the "
        "run whose phase timers gave the optimizer's time; fabric: busbw curves and the power "
        "during collectives; gemm: a GEMM table (MatMul efficiency by shape); unused: given "
        "but not chosen.")
    bundle: str = Field(description="The bundle's id (its directory name).")
    path: str = Field(description="The path it was read from.")
    sums_sha256: str = Field(description="SHA-256 of its SHA256SUMS, which pins every file (of a "
                             "GEMM table: of the file itself).")
    what: str = Field(description="Workload, platform and layout, one line.")


class StageRecord(BaseModel):
    """One pipeline stage of the projected step (one rank's view), seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: int
    compute_s: float = Field(description="Device compute per micro-batch.")
    compute_by_category_s: dict[str, float]
    idle_s: Triple = Field(description="Idle per micro-batch.")
    blocking_comm_s: Triple = Field(description="Blocking communication per micro-batch.")
    micro_batch_s: Triple = Field(description="The three together (with the host floor).")
    p2p_sync_s: Triple | None = Field(
        default=None, description="Per micro-batch: the device drain after an eager "
        "pipeline's p2p calls (kit.projection.host); null in files written before it.")
    optimizer_s: float = Field(description="Optimizer step, per step.")
    tail_s: Triple = Field(description="Exposed per-step collectives plus the optimizer.")


class CollectiveRecord(BaseModel):
    """One kind of collective of one stage (kit.projection.volumes) with its projected time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: int
    what: str
    op: str
    group: str
    group_size: int
    members_per_node: int
    nodes: int
    size_bytes: int = Field(description="nccl-tests' S of one call.")
    calls: int
    scope: Literal["micro_batch", "step"]
    time_s: Triple = Field(description="All calls, per micro-batch or per step.")
    exposed_s: Triple


class ProjectionFile(BaseModel):
    """``<name>.projection.json`` (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["charllm-kit projection"] = KIND
    version: Literal[1] = VERSION
    projected: Literal[True] = Field(True, description="Always true: a model's figures.")
    kit_version: str
    git_commit: str | None
    created_utc: str
    command: list[str]
    inputs: list[ProjectionInput]
    config: dict[str, Any] = Field(description="The target's resolved RunConfig, as JSON.")
    summary: dict[str, float | int | None] = Field(
        description="The canonical summary keys (docs/metrics.md); null where not projected.")
    interval: dict[str, Triple] = Field(
        description="[low, point, high] of each projected summary key.")
    step: dict[str, Any] = Field(
        description="pipeline_s, bubble_s, bubble_frac_analytical, micro_batches, graphed, "
        "bound (compute, memory or link), bound_shares, bound_stage.")
    stages: list[StageRecord]
    collectives: list[CollectiveRecord]
    power: dict[str, Any] | None = Field(
        description="compute_w, comm_w, idle_w used by the point; null without power.")
    memory: dict[str, Any] = Field(description="kit.plan.memory's estimate of the target.")
    assumptions: list[str]
    notes: list[str]
    source_kind: str | None = Field(
        None, description="The GPU kind (platform name) the measured inputs came from.")
    provenance: dict[str, str] = Field(
        default_factory=dict, description="Where each input of the model came from, per part "
        "(compute, matmul_efficiency, memory_bound, attention, idle, links, power): a measured "
        "bundle, a measured GEMM table, a datasheet, or assumed.")


def is_projection_file(path: str | Path) -> bool:
    """Whether ``path`` names a projection file (by its suffix) rather than a bundle."""
    return str(path).endswith(SUFFIX) and Path(path).is_file()


def read_projection(path: str | Path) -> ProjectionFile:
    """Read and check a projection file.

    Raises:
        BundleError: Unreadable, not JSON, or not a projection of this version.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BundleError(f"projection {p} is not readable JSON ({e})".splitlines()[0]) from None
    try:
        return ProjectionFile.model_validate(data)
    except ValidationError as e:
        raise BundleError(f"projection {p} fails its schema: "
                          f"{describe_validation_error(e)}") from None


def write_projection(projection: ProjectionFile, path: Path) -> Path:
    """Write ``projection`` to ``path`` (which must end in :data:`SUFFIX`)."""
    if not path.name.endswith(SUFFIX):
        raise ValueError(f"a projection file's name ends in {SUFFIX}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(projection.model_dump_json(indent=1) + "\n", encoding="utf-8")
    return path


def _ranks(config: dict[str, Any]) -> list[RankRecord]:
    """Rank records of the target layout (megatron-core's order), none of them run."""
    from kit.config.run import ParallelConfig
    from kit.engines import engine_spec

    parallel = ParallelConfig.model_validate(config["parallel"])
    per_node = config.get("devices_per_node") or parallel.world_size
    spec = engine_spec(config["engine"])
    out = []
    for r in range(parallel.world_size):
        place = spec.placement(parallel, r)
        out.append(RankRecord(rank=r, node=r // per_node, local_rank=r % per_node,
                              stage=place["pp_rank"], status="ok", error=None, **place))
    return out


@dataclass(frozen=True)
class ProjectedBundle(Bundle):
    """A projection file read as a bundle (module docstring): the model's figures in the
    manifest and metrics a bundle has, and the projection itself. It has no steps, telemetry,
    experts or profile. The bundle reader knows nothing of projections; readers that show
    both ask :func:`projection_of`."""

    projection: ProjectionFile = field(kw_only=True)

    @cached_property
    def experts(self) -> pa.Table | None:
        """None: a projection has no expert-load table."""
        return None


def projection_of(bundle: Bundle) -> ProjectionFile | None:
    """The projection ``bundle`` stands for; None for a measured bundle."""
    return bundle.projection if isinstance(bundle, ProjectedBundle) else None


def projected_bundle(path: str | Path) -> ProjectedBundle:
    """A projection file as a :class:`ProjectedBundle` (module docstring).

    Raises:
        BundleError: As :func:`read_projection`.
    """
    proj = read_projection(path)
    cfg = proj.config
    workload = {**cfg["workload"], "scaling": cfg.get("scaling")}
    manifest = Manifest(
        kit_version=proj.kit_version, git_commit=proj.git_commit, created_utc=proj.created_utc,
        status="ok", error=None, command=proj.command, config=cfg, workload=workload,
        platform=cfg["platform"], inventory=[],
        telemetry_sources={"power_w": FieldSource(
            source="projected", period_ms=None,
            reason="projected from the inputs' power (kit.projection.power)")},
        ranks=_ranks(cfg))
    inputs = ", ".join(f"{i.bundle} ({i.role})" for i in proj.inputs if i.role != "unused")
    metrics = MetricsFile(
        summary={k: proj.summary.get(k) for k in SUMMARY_KEYS},
        power={"energy_source": "projected"},
        notes=[f"projected by charllm-kit project from {inputs}", *proj.assumptions])
    return ProjectedBundle(path=Path(path), manifest=manifest, metrics=metrics, projection=proj)


def memory_estimate_text(proj: ProjectionFile) -> str:
    """The memory estimate as ``run --dry-run`` gives it: the peak stage's total per device,
    framework overhead included (a projection file without ``total_gib`` predates it)."""
    total = proj.memory.get("total_gib")
    if total is None:
        return f"{proj.memory['allocated_gib']:.4g} GiB (tensors only)"
    return f"{total:.4g} GiB"


def projection_facts(proj: ProjectionFile) -> list[tuple[str, str]]:
    """What a report shows of a projection in place of a run's figures: that it is one, its
    inputs, intervals, model parts and assumptions."""
    step = proj.step
    bubble = step.get("bubble_frac_analytical")
    facts = [("PROJECTED", "a model's figures, not a measurement (charllm-kit project)"),
             *((f"input ({i.role})", f"{i.bundle}: {i.what}") for i in proj.inputs),
             *((f"{k} [low, point, high]", ", ".join(f"{x:.4g}" for x in v))
               for k, v in proj.interval.items()),
             ("micro-batches per step", str(step.get("micro_batches"))),
             ("pipeline bubble (analytical)", "none" if bubble is None else f"{bubble:.1%}"),
             ("memory (estimate)", f"{memory_estimate_text(proj)} per device"),
             *(("assumption", a) for a in proj.assumptions),
             *(("note", n) for n in proj.notes)]
    return facts
