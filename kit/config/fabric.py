"""What a fabric run measures: which collectives, at which message sizes.

A fabric run is a :class:`~kit.config.run.RunConfig` whose workload slot holds a
:class:`FabricSpec` (``family: fabric``) instead of a model, so it launches, samples telemetry
and publishes its bundle through the same code as training. Its ranks form one group of
``world_size``; ``steps`` and ``warmup`` are the timed and untimed iterations per size.
"""

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
OPS: tuple[CollectiveOp, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                 "send_recv")
DEFAULT_SIZES_CPU = tuple(1 << k for k in range(10, 23, 4))
"""1 KiB to 4 MiB by 16x: enough to see latency and bandwidth over gloo in seconds."""
DEFAULT_SIZES_GPU = tuple(1 << k for k in range(10, 31, 2))
"""1 KiB to 1 GiB by 4x, the range nccl-tests' users sweep."""
_SIZE = re.compile(r"(\d+)([KMG]?)(i?B)?", re.IGNORECASE)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class FabricSpec(BaseModel):
    """The collective microbenchmark, in the place of a model (manifest ``workload``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: Literal["fabric"] = Field("fabric", description="Marks a fabric run.")
    name: Literal["fabric"] = Field("fabric", description="Its bundles' workload name.")
    description: str = Field(
        "collective microbenchmark over torch.distributed (no model trains)",
        description="One line for tables.")
    ops: tuple[CollectiveOp, ...] = Field(OPS, min_length=1, description="Collectives measured.")
    sizes_bytes: tuple[int, ...] = Field(
        min_length=1, description="Message sizes S as nccl-tests defines them (all-reduce: the "
        "buffer; all-gather: the gathered output; reduce-scatter: the input; all-to-all: each "
        "rank's send buffer; send/recv: what each rank sends), bytes; rounded down per op to a "
        "multiple of ranks x 4 bytes (fp32 elements).")
    graph: bool = Field(
        True, description="On CUDA devices, also time each point's operations replayed from a "
        "CUDA graph (nccl-tests' -G); CPU ranks time the host loop only.")


def parse_sizes(text: str) -> tuple[int, ...]:
    """``1K,64M,1G`` (binary units; ``B``/``iB`` optional) as sorted distinct byte counts.

    Raises:
        ValueError: A size that is not a positive count with an optional K, M or G.
    """
    out = set()
    for part in text.split(","):
        match = _SIZE.fullmatch(part.strip())
        if not match or int(match.group(1)) == 0:
            raise ValueError(f"size {part.strip()!r}: use a positive count with K, M or G, "
                             "e.g. 4K,1M,256M")
        out.add(int(match.group(1)) * _UNIT[match.group(2).upper()])
    return tuple(sorted(out))


def parse_ops(text: str) -> tuple[CollectiveOp, ...]:
    """``all_reduce,send_recv`` as collectives in the order given.

    Raises:
        ValueError: A name that is not one of :data:`OPS`.
    """
    out: list[CollectiveOp] = []
    for part in text.split(","):
        name = part.strip()
        op = next((o for o in OPS if o == name), None)
        if op is None:
            raise ValueError(f"unknown collective {name!r}: choose from {', '.join(OPS)}")
        if op not in out:
            out.append(op)
    return tuple(out)
