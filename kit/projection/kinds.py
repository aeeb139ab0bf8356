"""How a measured run's compute categories change on the target: GEMM shapes, and GPU kind.

Per target stage, each compute category's seconds (kit.projection.compute, already scaled by the
work) are multiplied by a factor:

* **MatMul**, where a GEMM table (kit.projection.gemm) exists for the source kind and for the
  target kind (the same table when they are one kind): ``eff_source(source run's GEMMs) /
  eff_target(target stage's GEMMs)``. Without one and on the same kind: 1 (the measured
  efficiency at every shape, as before), said in the assumptions.
* Across kinds (the target ``--platform`` is another GPU than the runs measured): the
  memory-bound categories (norm, element-wise/memory, other; and the optimizer, fused Adam
  streaming the parameters) by the datasheet memory bandwidth ratio ``B_source / B_target``;
  attention (flash attention: tensor-core bound) by the datasheet dense peak ratio. Idle (host
  launch gaps) is kept. A projection across kinds needs both GEMM tables, both bandwidths and a
  profiled run: without them a category's time on the other GPU would be a guess, and it is
  refused.

Each factor's origin (measured bundle, measured GEMM table, datasheet, assumed) is recorded in
the projection's ``provenance``.
"""

from dataclasses import dataclass, field
from pathlib import Path

from kit.config.loader import load_platform
from kit.config.platform import PlatformSpec
from kit.config.run import RunConfig
from kit.errors import KitInputError
from kit.projection.gemm import GemmTable, read_gemm_table, shipped_table, stage_gemms
from kit.projection.sources import UNPROFILED, MeasuredRun

MEMORY_BOUND = ("norm", "elementwise/memory", "other")


@dataclass(frozen=True, eq=False)
class TableInput:
    """A GEMM table and where it came from."""

    table: GemmTable
    path: Path


@dataclass
class KindScale:
    """Factors per compute category for each target stage (module docstring)."""

    source_kind: str
    target_kind: str
    source_table: TableInput | None
    target_table: TableInput | None
    source_eff_tflops: float | None
    memory_ratio: float
    """``B_source / B_target`` (1 on one kind)."""
    peak_ratio: float
    """Dense peak ``source / target`` for the dtype (1 on one kind)."""
    provenance: dict[str, str] = field(default_factory=dict)

    @property
    def cross_kind(self) -> bool:
        """Whether the target is another GPU kind than the runs measured."""
        return self.source_kind != self.target_kind

    def matmul_factor(self, cfg: RunConfig, stage: int) -> float:
        """``eff_source / eff_target(stage)``, 1 without tables."""
        if self.target_table is None or self.source_eff_tflops is None:
            return 1.0
        return self.source_eff_tflops / self.target_table.table.efficiency_tflops(
            stage_gemms(cfg, stage))

    def factors(self, cfg: RunConfig, stage: int) -> dict[str, float]:
        """Per compute category (missing: 1) for one target stage."""
        out = {"MatMul": self.matmul_factor(cfg, stage)}
        if self.cross_kind:
            out.update(dict.fromkeys(MEMORY_BOUND, self.memory_ratio))
            out["attention"] = self.peak_ratio
        return out


def datasheet(platform: PlatformSpec) -> PlatformSpec:
    """The platform as recorded, its datasheet fields filled from the shipped profile of the same
    name where the recording predates them."""
    if platform.memory_bandwidth_gbps is not None and platform.tdp_w is not None:
        return platform
    try:
        shipped = load_platform(platform.name)
    except KitInputError:
        return platform
    return platform.model_copy(update={
        "memory_bandwidth_gbps": platform.memory_bandwidth_gbps or shipped.memory_bandwidth_gbps,
        "tdp_w": platform.tdp_w or shipped.tdp_w})


def _table_for(kind: str, given: dict[str, TableInput]) -> TableInput | None:
    if kind in given:
        return given[kind]
    path = shipped_table(kind)
    return None if path is None else TableInput(read_gemm_table(path), path)


def read_tables(paths: list[Path]) -> dict[str, TableInput]:
    """GEMM tables given on the command line, by platform.

    Raises:
        KitInputError: Unreadable, or two tables of one platform.
    """
    out: dict[str, TableInput] = {}
    for p in paths:
        t = read_gemm_table(p)
        if t.platform in out:
            raise KitInputError(f"two GEMM tables of {t.platform} given ({out[t.platform].path}, "
                                f"{p}): give one per GPU kind")
        out[t.platform] = TableInput(t, p)
    return out


def _refuse(source: str, target: str, what: str) -> KitInputError:
    return KitInputError(f"projecting {source} runs onto {target}: {what}")


def kind_scale(run: MeasuredRun, target: PlatformSpec, tables: dict[str, TableInput]) -> KindScale:
    """The factors from the chosen ``run`` to ``target`` (module docstring).

    Raises:
        KitInputError: Across kinds without both GEMM tables, both memory bandwidths or a
            profiled run (the figure would be a guess).
    """
    source = datasheet(run.cfg.platform)
    dest = datasheet(target)
    src_kind, dst_kind = source.name, dest.name
    src_table = _table_for(src_kind, tables)
    # one kind, one table: the same object (read once), so it is listed and named once
    dst_table = src_table if dst_kind == src_kind else _table_for(dst_kind, tables)
    prov = {"compute": f"measured bundle {run.bundle.path.name} ({src_kind})"}
    if src_kind != dst_kind:
        missing = [k for k, t in ((src_kind, src_table), (dst_kind, dst_table)) if t is None]
        if missing:
            raise _refuse(src_kind, dst_kind, "no GEMM table of " + " and ".join(missing)
                          + " (measure one with `charllm-kit platforms gemm` on that GPU and "
                          "give its .gemm.json with the bundles)")
        if run.parts.timeline == "none" or UNPROFILED in run.parts.compute:
            raise _refuse(src_kind, dst_kind, f"{run.bundle.path.name} has no profile: its "
                          "step cannot be split into compute- and memory-bound parts")
        if source.memory_bandwidth_gbps is None or dest.memory_bandwidth_gbps is None:
            raise _refuse(src_kind, dst_kind, "a platform profile without "
                          "memory_bandwidth_gbps")
        peak_s, peak_d = source.peak_tflops.get(run.cfg.dtype), dest.peak_tflops.get(run.cfg.dtype)
        if not peak_s or not peak_d:
            raise _refuse(src_kind, dst_kind, f"no {run.cfg.dtype} dense peak in a profile")
        memory_ratio = source.memory_bandwidth_gbps / dest.memory_bandwidth_gbps
        peak_ratio = peak_s / peak_d
        prov["memory_bound"] = (f"datasheet memory bandwidth {source.memory_bandwidth_gbps:g} -> "
                                f"{dest.memory_bandwidth_gbps:g} GB/s")
        prov["attention"] = f"datasheet dense {run.cfg.dtype} peak {peak_s:g} -> {peak_d:g} TF/s"
        prov["idle"] = "assumed: the source kind's host gaps per layer"
    else:
        memory_ratio = peak_ratio = 1.0
    src_eff = None
    if "MatMul" not in run.parts.compute:
        prov["matmul_efficiency"] = (f"assumed: {run.bundle.path.name} has no profile to single "
                                     "out its MatMul time; the measured efficiency at every shape")
    elif src_table is not None and dst_table is not None:
        src_eff = src_table.table.efficiency_tflops(stage_gemms(run.cfg, 0))
        prov["matmul_efficiency"] = ("measured GEMM table " + (
            src_table.path.name if src_table is dst_table
            else f"{src_table.path.name} -> {dst_table.path.name}"))
    else:
        prov["matmul_efficiency"] = (f"assumed: no GEMM table of {src_kind}, the measured run's "
                                     "efficiency at every shape")
    return KindScale(src_kind, dst_kind, src_table, dst_table, src_eff, memory_ratio, peak_ratio,
                     prov)
