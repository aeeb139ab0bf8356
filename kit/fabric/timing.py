"""How one collective is timed: a host loop, and on CUDA the same operations in a CUDA graph.

The host loop launches ``iters`` operations one after another from Python and waits for the
device at the end, as nccl-tests does without ``-G``: for small messages it measures the launch
path (Python, torch.distributed, the NCCL enqueue: tens of microseconds), not the fabric. The
graph mode, as nccl-tests' ``-G``, captures the ``iters`` operations in one CUDA graph and
replays it, so the device runs them back to back and the time is the collective's own.

Small messages also get more iterations (:func:`iterations_for`): 20 operations of 1 KiB take
under a millisecond, too short to time against a clock read and two synchronizations.
"""

import time
from collections.abc import Callable

POINT_BYTES = 64 << 20
"""A point moves at least this much, or runs :data:`MAX_ITERS_FACTOR` x ``--iters``."""
MAX_ITERS_FACTOR = 50
"""Small messages run at most this many times ``--iters`` operations (1000 for the default)."""
GRAPH_NCCL_ENV = ("NCCL_GRAPH_MIXING_SUPPORT", "0")
"""Set (unless given) before NCCL starts when graphs are timed. NCCL's support for graphs mixed
with other launches on a communicator costs time per captured collective that grows with the
graph: on 4 H100s (torch 2.11, NCCL 2.28.9) a 1 KiB all-reduce took 13.5 us per operation in a
graph of 20 and 68 us in a graph of 1000 with it, 10.2 and 7.9 us without. NCCL documents it as
safe to turn off when no graph launch is outstanding beside another launch: the benchmark
synchronizes the device after every replay."""


def iterations_for(size_bytes: int, iters: int) -> int:
    """Timed operations at ``size_bytes``: ``iters`` at least, more for small messages.

    Enough operations to move :data:`POINT_BYTES`, within ``iters`` .. ``MAX_ITERS_FACTOR x
    iters``: with ``--iters 20``, 1000 operations up to 64 KiB, 64 at 1 MiB, 20 from 4 MiB.
    """
    return min(max(iters, -(-POINT_BYTES // size_bytes)), iters * MAX_ITERS_FACTOR)


def time_host_loop(fn: Callable[[], None], warmup: int, iters: int, sync: Callable[[], None],
                   barrier: Callable[[], object]) -> tuple[float, float, float]:
    """(mean seconds per op, start, end in unix s) of ``iters`` ops after ``warmup`` untimed
    ones, launched one by one from here, between a barrier and a device synchronization."""
    for _ in range(warmup):
        fn()
    sync()
    barrier()
    t0 = time.time()
    for _ in range(iters):
        fn()
    sync()
    t1 = time.time()
    return (t1 - t0) / iters, t0, t1


def time_cuda_graph(fn: Callable[[], None], iters: int, barrier: Callable[[], object]) -> float:
    """Mean seconds per op of ``iters`` ops captured in one CUDA graph, replayed once untimed
    and once timed (between a barrier and a synchronization), as nccl-tests' ``-G``.

    The communicator must already exist (a host-loop run of ``fn`` first): NCCL cannot create
    one while a stream is captured.
    """
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    barrier()
    t0 = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    del graph
    return elapsed / iters
