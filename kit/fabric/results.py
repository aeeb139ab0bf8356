"""``fabric.json``: a fabric run's measurements, one point per collective and message size."""

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tabulate import tabulate

from kit.bundle.reader import Bundle
from kit.config.fabric import CollectiveOp
from kit.errors import BundleError

RESULTS_NAME = "fabric.json"


class FabricPoint(BaseModel):
    """One collective at one message size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: CollectiveOp
    size_bytes: int = Field(gt=0, description="S as nccl-tests defines it (kit.config.fabric).")
    iterations: int | None = Field(
        None, gt=0, description="Timed operations of this point (more than the run's "
        "iterations for small messages, kit.fabric.timing); null in bundles of kits that timed "
        "every point alike, the run's iterations.")
    time_s: float = Field(gt=0, description="Mean time of one operation launched in a host "
                          "loop, averaged over ranks (nccl-tests' default).")
    time_s_max: float = Field(gt=0, description="The slowest rank's mean time.")
    algbw_gbps: float = Field(description="S / time_s, 10^9 bytes/s.")
    busbw_gbps: float = Field(description="algbw x nccl-tests' factor for the op.")
    graph_time_s: float | None = Field(
        None, gt=0, description="Mean time of one operation of the same count replayed from a "
        "CUDA graph (nccl-tests' -G), averaged over ranks; null where not measured (CPU ranks).")
    graph_time_s_max: float | None = Field(None, gt=0, description="The slowest rank's.")
    graph_algbw_gbps: float | None = Field(None, description="S / graph_time_s.")
    graph_busbw_gbps: float | None = Field(None, description="graph algbw x the op's factor.")
    t_start: float = Field(description="When rank 0 started the timed host loop, unix s.")
    t_end: float = Field(description="When rank 0 ended it, unix s.")


class FabricResults(BaseModel):
    """What a fabric run measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ranks: int = Field(gt=0, description="Ranks in the group (n in the bus factors).")
    backend: str = Field(description="torch.distributed backend (gloo, nccl; rccl runs as nccl).")
    iterations: int = Field(gt=0, description="Timed operations per point, at least "
                            "(small messages get more: each point's own iterations).")
    warmup: int = Field(ge=0, description="Untimed operations before them.")
    graph: bool = Field(False, description="Whether the points have CUDA-graph times.")
    points: list[FabricPoint]


def read_fabric(bundle: Bundle) -> FabricResults | None:
    """The bundle's fabric results; None for a training run's bundle (or a failed fabric run).

    Raises:
        BundleError: ``fabric.json`` does not match :class:`FabricResults`.
    """
    path = bundle.path / RESULTS_NAME
    if not path.is_file():
        return None
    try:
        return FabricResults.model_validate_json(path.read_text(encoding="utf-8"))
    except (ValidationError, ValueError) as e:
        raise BundleError(f"{path} is not fabric results ({e})".splitlines()[0]) from None


def _us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f}"


def _gbps(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def fabric_table(results: FabricResults) -> str:
    """The measurements as nccl-tests prints them: size, time, algbw, busbw per collective, for
    the host loop and, where measured, the CUDA graph."""
    graph = any(p.graph_time_s is not None for p in results.points)
    rows = []
    for p in results.points:
        row = [p.op, p.size_bytes, p.iterations or results.iterations, _us(p.time_s),
               _gbps(p.algbw_gbps), _gbps(p.busbw_gbps)]
        if graph:
            row += [_us(p.graph_time_s), _gbps(p.graph_algbw_gbps), _gbps(p.graph_busbw_gbps)]
        rows.append(row)
    headers = ["op", "size (B)", "iters", "time (us)", "algbw (GB/s)", "busbw (GB/s)"]
    if graph:
        headers += ["graph time (us)", "graph algbw", "graph busbw"]
    head = (f"{results.ranks} ranks over {results.backend}, at least {results.iterations} timed "
            "iterations per point; time: launched in a host loop"
            + ("; graph: the same operations replayed from a CUDA graph" if graph else ""))
    return head + "\n" + tabulate(rows, headers=headers, disable_numparse=True)
