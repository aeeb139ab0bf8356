"""``fabric.json``: a fabric run's measurements, one point per collective and message size."""

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tabulate import tabulate

from kit.bundle.reader import Bundle
from kit.errors import BundleError
from kit.fabric.spec import CollectiveOp

RESULTS_NAME = "fabric.json"


class FabricPoint(BaseModel):
    """One collective at one message size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: CollectiveOp
    size_bytes: int = Field(gt=0, description="S as nccl-tests defines it (kit.fabric.spec).")
    time_s: float = Field(gt=0, description="Mean time of one operation, averaged over "
                          "ranks (nccl-tests' default).")
    time_s_max: float = Field(gt=0, description="The slowest rank's mean time.")
    algbw_gbps: float = Field(description="S / time_s, 10^9 bytes/s.")
    busbw_gbps: float = Field(description="algbw x nccl-tests' factor for the op.")
    t_start: float = Field(description="When rank 0 started the timed iterations, unix s.")
    t_end: float = Field(description="When rank 0 ended them, unix s.")


class FabricResults(BaseModel):
    """What a fabric run measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ranks: int = Field(gt=0, description="Ranks in the group (n in the bus factors).")
    backend: str = Field(description="torch.distributed backend (gloo, nccl; rccl runs as nccl).")
    iterations: int = Field(gt=0, description="Timed operations per point.")
    warmup: int = Field(ge=0, description="Untimed operations before them.")
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


def fabric_table(results: FabricResults) -> str:
    """The measurements as nccl-tests prints them: size, time, algbw, busbw per collective."""
    rows = [(p.op, p.size_bytes, f"{p.time_s * 1e6:.1f}", f"{p.algbw_gbps:.3f}",
             f"{p.busbw_gbps:.3f}") for p in results.points]
    head = f"{results.ranks} ranks over {results.backend}, {results.iterations} timed iterations"
    return head + "\n" + tabulate(rows, headers=("op", "size (B)", "time (us)", "algbw (GB/s)",
                                                 "busbw (GB/s)"), disable_numparse=True)
