"""Entry point of one fabric rank: ``python -m kit.fabric.worker STAGING_DIR``.

Started by the same launcher as training ranks (kit.launch.local; on a CPU platform forked from
one process that imported torch for all, kit.launch.rank_fork), it reads the resolved
config, and for each collective and size runs ``warmup`` untimed and at least ``steps`` timed
operations in a host loop and, on CUDA devices, the same operations replayed from a CUDA graph
(kit.fabric.timing). Every rank's mean times are all-reduced; rank 0 reports each point as it
goes (the launcher prints it) and writes ``fabric.json`` into the staging folder, so the bundle
carries it. Each rank writes its :class:`~kit.launch.rankfile.RankResult` (no steps) as
training ranks do, so the launcher and the bundle see how it ended.
"""

import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from kit.atomic_write import write_atomic
from kit.config.fabric import CollectiveOp, FabricSpec
from kit.fabric.bandwidth import algbw_gbps, busbw_gbps, message_bytes
from kit.fabric.progress import report_point
from kit.fabric.results import RESULTS_NAME, FabricPoint, FabricResults
from kit.fabric.timing import GRAPH_NCCL_ENV, iterations_for, time_cuda_graph, time_host_loop
from kit.launch.rank_fork import RANK_SIGNALS
from kit.launch.rankfile import RankResult, read_config, write_rank_result


def _operation(op: CollectiveOp, size: int, rank: int, world: int,
               device: torch.device) -> Callable[[], None]:
    """One ``op`` of ``size`` bytes (nccl-tests' S) on fp32 buffers, as a callable."""
    n = size // 4
    if op == "all_reduce":
        buf = torch.ones(n, device=device)
        return lambda: dist.all_reduce(buf)
    if op == "all_gather":
        out, shard = torch.empty(n, device=device), torch.ones(n // world, device=device)
        return lambda: dist.all_gather_into_tensor(out, shard)
    if op == "reduce_scatter":
        full, shard = torch.ones(n, device=device), torch.empty(n // world, device=device)
        return lambda: dist.reduce_scatter_tensor(shard, full)
    if op == "all_to_all":
        src, dst = torch.ones(n, device=device), torch.empty(n, device=device)
        return lambda: dist.all_to_all_single(dst, src)
    send, recv = torch.ones(n, device=device), torch.empty(n, device=device)
    ring = [dist.P2POp(dist.isend, send, (rank + 1) % world),
            dist.P2POp(dist.irecv, recv, (rank - 1) % world)]

    def send_recv() -> None:  # each rank sends to the next and receives from the previous
        for work in dist.batch_isend_irecv(ring):
            work.wait()

    return send_recv


def _over_ranks(values: list[float], world: int,
                device: torch.device) -> tuple[list[float], list[float]]:
    """Each of this rank's ``values`` averaged over the ranks (sum / n), and their maximum."""
    total = torch.tensor(values, dtype=torch.float64, device=device)
    slowest = total.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return [x / world for x in total.tolist()], slowest.tolist()


def _point(op: CollectiveOp, size: int, iters: int, loop: tuple[float, float, float],
           graph_s: float | None, world: int, device: torch.device) -> FabricPoint:
    """One point from this rank's mean times: the host loop's and, if timed, the graph's."""
    mean, t0, t1 = loop
    (avg, graph_avg), (slowest, graph_slowest) = _over_ranks([mean, graph_s or 0.0], world,
                                                             device)
    graph = {} if graph_s is None else {
        "graph_time_s": graph_avg, "graph_time_s_max": graph_slowest,
        "graph_algbw_gbps": algbw_gbps(size, graph_avg),
        "graph_busbw_gbps": busbw_gbps(op, size, graph_avg, world)}
    return FabricPoint(op=op, size_bytes=size, iterations=iters, time_s=avg,
                       time_s_max=slowest, algbw_gbps=algbw_gbps(size, avg),
                       busbw_gbps=busbw_gbps(op, size, avg, world), t_start=t0, t_end=t1,
                       **graph)


def preload(staging: Path) -> None:
    """What a zygote imports once for the fabric ranks it forks (kit.launch.rank_fork): this
    module's imports, torch and torch.distributed, are all a fabric rank needs."""


def run_rank(staging: Path, started: float | None = None) -> int:
    """Run this rank's measurements; return its exit code.

    ``started`` (when a forked rank's zygote began) is not used: a fabric rank keeps no
    start-up phases. A forked rank starts with SIGTERM and SIGINT blocked; they are let
    through here, with their default action.
    """
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RANK_SIGNALS)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    result = RankResult(rank=rank, local_rank=local_rank, node=int(os.environ.get("GROUP_RANK",
                                                                                  "0")))
    try:
        cfg = read_config(staging)
        spec = cfg.workload
        assert isinstance(spec, FabricSpec), "kit.fabric.worker runs fabric configs only"
        cpu = cfg.platform.is_cpu
        device = torch.device("cpu") if cpu else torch.device("cuda", local_rank)
        if not cpu:
            torch.cuda.set_device(device)
        backend = "gloo" if cpu else "nccl"
        graph = spec.graph and not cpu
        if graph:
            os.environ.setdefault(*GRAPH_NCCL_ENV)
        dist.init_process_group(backend, rank=rank, world_size=world)
        sync = (lambda: None) if cpu else torch.cuda.synchronize
        # NCCL's barrier must be told the rank's device, or it guesses (and may hang)
        barrier = dist.barrier if cpu else lambda: dist.barrier(device_ids=[local_rank])
        points = []
        for op in spec.ops:
            for requested in spec.sizes_bytes:
                size = message_bytes(op, requested, world)
                iters = iterations_for(size, cfg.steps)
                fn = _operation(op, size, rank, world, device)
                loop = time_host_loop(fn, cfg.warmup, iters, sync, barrier)
                graph_s = time_cuda_graph(fn, iters, barrier) if graph else None
                point = _point(op, size, iters, loop, graph_s, world, device)
                points.append(point)
                print(f"rank {rank}: {op} {size} B x{iters}: {point.time_s * 1e6:.1f} us"
                      + (f", graph {point.graph_time_s * 1e6:.1f} us" if graph_s else ""),
                      flush=True)
                if rank == 0:
                    report_point(staging, point)
        if rank == 0:
            results = FabricResults(ranks=world, backend=backend, iterations=cfg.steps,
                                    warmup=cfg.warmup, graph=graph, points=points)
            write_atomic(staging / RESULTS_NAME, lambda tmp: tmp.write_text(
                results.model_dump_json(indent=1) + "\n", encoding="utf-8"), fsync=True)
        result.status = "ok"
        dist.destroy_process_group()
        return 0
    except Exception as e:  # the bundle says why, not only the log
        result.status = "failed"
        result.error = f"rank {rank}: {type(e).__name__}: {e}".splitlines()[0]
        traceback.print_exc()
        return 1
    finally:
        write_rank_result(staging, result)


if __name__ == "__main__":
    sys.exit(run_rank(Path(sys.argv[1])))
