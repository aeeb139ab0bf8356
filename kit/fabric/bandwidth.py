"""Algorithm and bus bandwidth exactly as NVIDIA's nccl-tests define them (doc/PERFORMANCE.md).

``algbw = S / t``, with ``S`` the operation's size in bytes (for all-gather the gathered output,
for reduce-scatter the full input, ``count x sizeof(type) x n`` in NCCL's terms) and ``t`` the
mean time of one operation. ``busbw = algbw x factor``, the factor turning algbw into the
traffic each rank's link must carry, so busbw compares with the hardware's peak independently
of the number of ranks ``n``: all-reduce ``2(n-1)/n``; reduce-scatter, all-gather and
all-to-all ``(n-1)/n``; send/recv (and broadcast, reduce) ``1``.
"""

from kit.config.fabric import CollectiveOp

ELEMENT_BYTES = 4
"""The benchmark moves fp32 elements, as nccl-tests does by default (``-d float``)."""


def bus_factor(op: CollectiveOp, ranks: int) -> float:
    """nccl-tests' busbw / algbw for ``op`` over ``ranks`` ranks."""
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


def message_bytes(op: CollectiveOp, requested: int, ranks: int) -> int:
    """``requested`` rounded down to what ``op`` can move in equal fp32 parts per rank."""
    unit = ELEMENT_BYTES * (1 if op in ("all_reduce", "send_recv") else ranks)
    return max(unit, requested - requested % unit)


def algbw_gbps(size_bytes: int, time_s: float) -> float:
    """Algorithm bandwidth, GB/s (10^9 bytes per second, as nccl-tests prints it)."""
    return size_bytes / time_s / 1e9


def busbw_gbps(op: CollectiveOp, size_bytes: int, time_s: float, ranks: int) -> float:
    """Bus bandwidth, GB/s."""
    return algbw_gbps(size_bytes, time_s) * bus_factor(op, ranks)
