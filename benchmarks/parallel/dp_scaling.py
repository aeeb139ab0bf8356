"""Data-parallel scaling: N GPUs against one on the same per-GPU batch, plain DDP and the kit.

Issue 5 asks the kit's DP2 to reach at least 1.9x the throughput of one GPU, and to beat plain
PyTorch DDP on the same pair. This measures both in one invocation, on the same model shape:

1. ``torch_ddp``: the plain PyTorch GPT of ``benchmarks/engine_throughput.py`` (SDPA flash
   attention, bf16 autocast, fused AdamW) under ``torch.nn.parallel.DistributedDataParallel``
   (default 25 MB buckets, ``no_sync`` on all but the last micro-batch), on 1 and N ranks
   launched by torchrun;
2. ``kit``: ``charllm-kit run`` of the same workload with ``--dp 1`` and ``--dp N`` (megatron's
   DDP; ``--kit-args`` adds options, default ``--overlap``), telemetry off.

Each rank trains ``--micro-batch`` x ``--accum`` samples per step in both, so the scaling is
``N * t(1) / t(N)``. ``--cpu`` runs the same over gloo on CPU processes (fp32), a check of this
script that needs no GPU.

    python benchmarks/parallel/dp_scaling.py --gpus 2 --json dp_scaling-h200x2.json
    python benchmarks/parallel/dp_scaling.py --gpus 2 --cpu --workload gpt3-tiny --micro-batch 2
"""

import argparse
import contextlib
import datetime as dt
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from ref_launch import BENCHMARKS, kit_summary, shared_arguments, torchrun_result


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ddp_worker(args: argparse.Namespace) -> None:
    """One torchrun rank of the plain DDP reference; rank 0 writes the figures to ``--result``."""
    sys.path.insert(0, str(BENCHMARKS))
    from engine_throughput import TorchGPT  # the same reference model as the one-GPU benchmark

    from kit.config.loader import load_workload

    cpu = args.cpu
    dist.init_process_group("gloo" if cpu else "nccl")
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    device = torch.device("cpu") if cpu else torch.device("cuda", local)
    if not cpu:
        torch.cuda.set_device(device)
    w = load_workload(args.workload)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        TorchGPT(w).to(device), device_ids=None if cpu else [local],
        gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=not cpu)
    gen = torch.Generator(device=device).manual_seed(1 + rank)
    tokens = torch.randint(0, w.vocab_size, (args.accum, args.micro_batch, w.seq_length + 1),
                           device=device, generator=gen)
    autocast = (contextlib.nullcontext if cpu
                else lambda: torch.autocast("cuda", dtype=torch.bfloat16))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        for m in range(args.accum):
            last = m == args.accum - 1
            with contextlib.nullcontext() if last else model.no_sync(), autocast():
                loss = model(tokens[m, :, :-1], tokens[m, :, 1:]) / args.accum
            loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    _sync(device)
    seconds = (time.perf_counter() - start) / args.steps
    worst = torch.tensor([seconds], dtype=torch.float64, device=device)  # NCCL: on the GPU
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the step ends when the slowest rank does
    if rank == 0:
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if not cpu else None
        Path(args.result).write_text(json.dumps({"step_s": worst.item(), "peak_mem_gib": peak}))
    dist.destroy_process_group()


def torch_ddp(args: argparse.Namespace, ranks: int) -> dict:
    """Seconds per step of the plain DDP reference on ``ranks`` processes (torchrun)."""
    return torchrun_result(__file__, ranks, _shared_args(args))


def kit_run(args: argparse.Namespace, ranks: int, out: Path) -> dict:
    """Seconds per measured step of ``charllm-kit run`` with ``--dp ranks`` (from its bundle)."""
    bundle, summary = kit_summary(
        [args.workload, "--dp", str(ranks), "--micro-batch", str(args.micro_batch),
         "--global-batch", str(args.micro_batch * args.accum * ranks),
         "--steps", str(args.steps), "--warmup", str(args.warmup),
         "--telemetry-interval-ms", "0", "--out", str(out), *shlex.split(args.kit_args)]
        + (["--platform", "cpu"] if args.cpu else []))
    return {"step_s": summary["step_time_s"], "bundle": bundle}


def _shared_args(args: argparse.Namespace) -> list[str]:
    shared = ["--workload", args.workload, "--micro-batch", str(args.micro_batch),
              "--accum", str(args.accum), "--steps", str(args.steps),
              "--warmup", str(args.warmup)]
    return shared + (["--cpu"] if args.cpu else [])


def _device_name(cpu: bool) -> str:
    return "CPU (gloo)" if cpu else torch.cuda.get_device_name(0)


def main() -> None:
    """Measure 1 and N ranks of both, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=2, help="N, the ranks to compare with one")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per rank per step")
    shared_arguments(parser, kit_args="--overlap")
    args = parser.parse_args()
    if args.worker:
        ddp_worker(args)
        return

    n = args.gpus
    head = (f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ} {_device_name(args.cpu)}; "
            f"torch {torch.__version__}; {args.workload}, micro-batch {args.micro_batch} x "
            f"{args.accum} per rank per step; 1 vs {n} ranks")
    print(head, flush=True)
    figures: dict = {"device": _device_name(args.cpu), "date": f"{dt.date.today()}",
                     "gpus": n, "workload": args.workload, "micro_batch": args.micro_batch,
                     "accum": args.accum, "kit_args": args.kit_args}
    with tempfile.TemporaryDirectory() as tmp:
        for name, measure in (("torch_ddp", lambda r: torch_ddp(args, r)),
                              ("kit", lambda r: kit_run(args, r, Path(tmp)))):
            one = measure(1)
            many = measure(n) if n > 1 else one  # --gpus 1: a check of the script, one run each
            scaling = n * one["step_s"] / many["step_s"]
            figures.update({f"{name}_1_step_s": one["step_s"], f"{name}_{n}_step_s":
                            many["step_s"], f"{name}_scaling": scaling})
    print()
    print(head)
    for name, label in (("torch_ddp", "plain PyTorch DDP"), ("kit", "kit (megatron DDP)")):
        print(f"{label:20s} 1 rank {figures[f'{name}_1_step_s'] * 1e3:9.1f} ms/step   "
              f"{n} ranks {figures[f'{name}_{n}_step_s'] * 1e3:9.1f} ms/step   "
              f"scaling {figures[f'{name}_scaling']:.3f}x")
    print(f"kit / plain DDP throughput on {n} ranks: "
          f"{figures[f'torch_ddp_{n}_step_s'] / figures[f'kit_{n}_step_s']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
