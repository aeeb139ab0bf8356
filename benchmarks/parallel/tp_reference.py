"""Plain PyTorch tensor + sequence parallelism, torchtitan's recipe: the reference for the kit's TP.

Issue 24 asks the kit's TP2+SP on gpt3-1.3b to be at or above plain PyTorch tensor parallelism
of the same shape. This trains ``TorchGPT`` of ``benchmarks/engine_throughput.py`` (vocabulary
padded as megatron pads it for ``--tp``) on ``--gpus`` torchrun ranks, parallelized as
torchtitan parallelizes Llama: a 2-D ``DeviceMesh`` (dp, tp; tp ranks adjacent, megatron's
order); ``parallelize_module`` with the token embedding vocabulary-parallel (``RowwiseParallel``,
reduce-scattered over the sequence), every LayerNorm ``SequenceParallel``, QKV and fc1
``ColwiseParallel``, attention output and fc2 ``RowwiseParallel``; the learned positions sharded
over the sequence; the tied logits vocabulary-parallel under ``loss_parallel`` (megatron's
vocabulary-parallel cross-entropy); every block ``torch.compile``d (``fullgraph``) after that.
bf16 autocast over fp32 weights (the norms' outputs cast to bf16, so the sequence all-gathers
move bf16 as megatron's do), fp32 gradients, clipping at 1.0, fused AdamW over the DTensor
parameters with megatron's betas and weight decay.

Data parallelism is done by hand, as megatron-core's DDP does it without ``--overlap``: every
local gradient is a view of one flat fp32 buffer that backward accumulates into; after the last
micro-batch one all-reduce over tp of the LayerNorms' slice (partial sums under sequence
parallelism) and one all-reduce of the whole buffer over dp: no overlap, no copies.

Each rank runs ``global_batch / (micro_batch * dp)`` micro-batches per step, the kit's gradient
accumulation. Step time is the median over measured steps of the slowest rank (each step ends
in a device synchronization), as the kit reports it; TFLOP/s and MFU use the kit's Megatron-LM
FLOP count and the platform's bf16 peak. ``--kit`` also runs ``charllm-kit run`` of the same
layout with ``--sp``; ``--profile`` profiles one more step on rank 0 (GPU idle, host operators).
``--cpu`` runs fp32 CPU ranks over gloo, eager unless ``--compile``: a check needing no GPU.

    python benchmarks/parallel/tp_reference.py --gpus 4 --tp 2 --kit --json tp_ref.json
    python benchmarks/parallel/tp_reference.py --cpu --workload gpt3-tiny --gpus 2 --tp 2
"""

import argparse
import contextlib
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ref_launch import BENCHMARKS, REPO, kit_summary, shared_arguments, torchrun_result
from torch import nn


def parallelize(model: nn.Module, tp_mesh, compile_blocks: bool,
                cast: torch.dtype | None) -> list[nn.Parameter]:
    """Shard ``model`` (a ``TorchGPT``) over ``tp_mesh`` in place; return the LayerNorm
    parameters, whose gradients come out as partial sums over tp."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    parallelize_module(model, tp_mesh, {
        "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "ln": SequenceParallel()})
    model.pos.weight = nn.Parameter(distribute_tensor(model.pos.weight.data, tp_mesh, [Shard(0)]))
    norms = [model.ln]
    for block in model.blocks:
        parallelize_module(block, tp_mesh, {
            "ln1": SequenceParallel(), "qkv": ColwiseParallel(input_layouts=Shard(1)),
            "proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel(), "fc1": ColwiseParallel(input_layouts=Shard(1)),
            "fc2": RowwiseParallel(output_layouts=Shard(1))})
        norms += [block.ln1, block.ln2]
    for norm in norms if cast is not None else []:  # autocast keeps them fp32, megatron bf16
        norm.register_forward_hook(lambda _m, _i, out: out.to(cast))
    if compile_blocks:
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block, fullgraph=True)
    return [p for norm in norms for p in norm.parameters()]


def gpt_loss(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``TorchGPT.forward`` on a tensor-parallel model: this rank's part of the sequence through
    the blocks, vocabulary-parallel logits and cross-entropy (inside ``loss_parallel``)."""
    from torch.distributed.tensor import Replicate

    x = model.tok(tokens) + model.pos.weight.to_local()
    for block in model.blocks:
        x = block(x)
    logits = model.ln(x).redistribute(placements=[Replicate()]) @ model.tok.weight.t()
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


class GradBuffer:
    """Every local gradient a view of one flat fp32 buffer (megatron-core's grad buffer).

    The partial-sum (LayerNorm) gradients sit at its end; they are marked ``Partial`` while
    backward accumulates and ``Replicate`` once reduced over tp, for clipping and the optimizer.
    """

    def __init__(self, params: list[nn.Parameter], partial: list[nn.Parameter], tp_mesh,
                 dp_group, dp: int) -> None:
        from torch.distributed.tensor import DTensor, Partial

        partial_ids = {id(p) for p in partial}
        ordered = [p for p in params if id(p) not in partial_ids] + partial
        sizes = [p.to_local().numel() for p in ordered]
        self.flat = torch.zeros(sum(sizes), dtype=torch.float32, device=ordered[0].device)
        self.partial_flat = self.flat[sum(sizes[:len(ordered) - len(partial)]):]
        self.tp_group, self.dp_group, self.dp = tp_mesh.get_group(), dp_group, dp
        self._swaps = []  # (param, grad marked Partial, grad marked Replicate)
        for p, view in zip(ordered, self.flat.split(sizes)):
            local = view.view_as(p.to_local())
            p.grad = DTensor.from_local(local, tp_mesh, p.placements, run_check=False,
                                        shape=p.shape, stride=p.stride())
            if id(p) in partial_ids:
                self._swaps.append((p, DTensor.from_local(local, tp_mesh, [Partial()],
                                                          run_check=False), p.grad))
        self.params = ordered
        self.zero()

    def reduce(self) -> None:
        """Sum the partial gradients over tp, then average the buffer over dp."""
        if self.tp_group.size() > 1:
            dist.all_reduce(self.partial_flat, group=self.tp_group)
        for p, _, replicated in self._swaps:
            p.grad = replicated
        if self.dp > 1:
            dist.all_reduce(self.flat, group=self.dp_group)  # the loss is pre-scaled by 1/dp

    def zero(self) -> None:
        """Zero the buffer in place, the partial gradients marked ``Partial`` again."""
        self.flat.zero_()
        for p, partial, _ in self._swaps:
            p.grad = partial

    def check(self) -> None:
        """Fail if backward replaced a gradient instead of accumulating into the buffer."""
        lo, hi = self.flat.data_ptr(), self.flat.data_ptr() + self.flat.numel() * 4
        if not all(lo <= p.grad.to_local().data_ptr() < hi for p in self.params):
            raise RuntimeError("a gradient left the flat buffer; the dp all-reduce would miss it")


def profiled_step(step, device: torch.device) -> dict:
    """One more step under ``torch.profiler``: its time, the time some kernel ran on the GPU
    (the union of kernel spans, NCCL's included) and the costliest host operators."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
    busy, end = 0.0, 0.0
    for a, b in sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type == DeviceType.CUDA):
        busy, end = busy + max(0.0, b - max(a, end)), max(end, b)
    return {"step_s": wall, "gpu_idle_frac": 1 - busy / 1e6 / wall if cuda else None,
            "table": prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)}


def worker(args: argparse.Namespace) -> None:
    """One torchrun rank; rank 0 writes the figures to ``--result``."""
    sys.path.insert(0, str(BENCHMARKS))
    from engine_throughput import TorchGPT  # the same reference model as the one-GPU benchmark
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    from kit.config.loader import load_workload

    cpu, dp = args.cpu, args.gpus // args.tp
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cpu") if cpu else torch.device("cuda", local_rank)
    if not cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if cpu else "nccl")
    mesh = init_device_mesh(device.type, (dp, args.tp), mesh_dim_names=("dp", "tp"))
    w = load_workload(args.workload)
    torch.manual_seed(0)  # the same full weights on every rank before sharding
    model = TorchGPT(w, args.tp).to(device)
    compiled = args.compile if args.compile is not None else not cpu
    bf16 = None if cpu else torch.bfloat16
    partial = parallelize(model, mesh["tp"], compiled, bf16)
    params = list(model.parameters())
    grads = GradBuffer(params, partial, mesh["tp"], mesh["dp"].get_group(), dp)
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=not cpu)
    accum = args.global_batch // (args.micro_batch * dp)
    gen = torch.Generator(device=device).manual_seed(1 + mesh["dp"].get_local_rank())
    tokens = torch.randint(0, w.vocab_size, (accum, args.micro_batch, w.seq_length + 1),
                           device=device, generator=gen)  # the same on a dp rank's tp ranks
    autocast = (contextlib.nullcontext() if cpu
                else torch.autocast("cuda", dtype=torch.bfloat16))

    def step() -> torch.Tensor:
        total = torch.zeros((), device=device)
        for m in range(accum):
            with autocast, loss_parallel():
                loss = gpt_loss(model, tokens[m, :, :-1], tokens[m, :, 1:])
                (loss / (accum * dp)).backward()
            total += loss.detach().to_local() / accum
        grads.reduce()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        grads.zero()
        return total

    losses, times = [], []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        losses.append(step())
        if not cpu:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        if i == 0:
            grads.check()
    profiled = None
    if args.profile:  # every rank runs the step, rank 0 records it
        profiled = profiled_step(step, device) if dist.get_rank() == 0 else step()
    worst = torch.tensor(times[args.warmup:], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank's does
    losses = [x.item() for x in losses]
    if not all(map(torch.isfinite, torch.tensor(losses))):
        raise RuntimeError(f"loss not finite: {losses}")
    if dist.get_rank() == 0:
        qkv = model.blocks[0].qkv.weight
        Path(args.result).write_text(json.dumps({
            "step_s": statistics.median(worst.tolist()), "step_s_mean": worst.mean().item(),
            "losses": losses, "compiled": compiled, "profile": profiled,
            "shard": f"blocks.0.qkv.weight {tuple(qkv.shape)} -> local "
                     f"{tuple(qkv.to_local().shape)} {qkv.placements}",
            "peak_mem_gib": None if cpu else torch.cuda.max_memory_allocated(device) / 2**30}))
    dist.destroy_process_group()


def reference(args: argparse.Namespace) -> dict:
    """The reference's figures from its torchrun ranks."""
    return torchrun_result(__file__, args.gpus, sys.argv[1:])


def kit_run(args: argparse.Namespace, dp: int, out: Path) -> dict:
    """Seconds per measured step of ``charllm-kit run`` of the same layout (its bundle)."""
    bundle, summary = kit_summary(
        [args.workload, "--tp", str(args.tp), "--dp", str(dp), "--sp",
         "--micro-batch", str(args.micro_batch), "--global-batch", str(args.global_batch),
         "--steps", str(args.steps), "--warmup", str(args.warmup),
         "--telemetry-interval-ms", "0", "--out", str(out), *shlex.split(args.kit_args)]
        + (["--platform", "cpu"] if args.cpu else []))
    return {"step_s": summary["step_time_s"], "tflops_per_gpu": summary["tflops_per_gpu"],
            "mfu": summary["mfu"], "bundle": bundle}


def _refusal(args: argparse.Namespace) -> str | None:
    """Why this layout cannot run, or None."""
    from kit.config.loader import load_workload

    w = load_workload(args.workload)
    dp = args.gpus // args.tp
    if args.gpus % args.tp:
        return f"--gpus {args.gpus} is not a multiple of --tp {args.tp}"
    if args.global_batch % (args.micro_batch * dp):
        return (f"--global-batch {args.global_batch} is not a multiple of micro-batch "
                f"{args.micro_batch} x dp {dp}")
    if w.activation != "gelu" or w.num_experts:
        return f"{w.name}: only dense GELU (GPT) workloads have a tensor-parallel reference here"
    if w.num_attention_heads % args.tp or w.seq_length % args.tp or w.ffn_hidden_size % args.tp:
        return f"{w.name}: heads, sequence and FFN width must divide by --tp {args.tp}"
    if not args.cpu and torch.cuda.device_count() < args.gpus:
        return f"--gpus {args.gpus}: only {torch.cuda.device_count()} CUDA devices visible"
    return None


def main() -> None:
    """Measure the reference (and with ``--kit`` the kit), print, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=4, help="ranks (dp = gpus / tp)")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction,
                        help="torch.compile each block (default: on GPU yes, on --cpu no)")
    parser.add_argument("--profile", action="store_true",
                        help="profile one more step on rank 0: GPU idle, costliest host ops")
    parser.add_argument("--kit", action="store_true", help="also run charllm-kit, same layout")
    shared_arguments(parser, kit_args="")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if (why := _refusal(args)) is not None:
        print(f"error: {why}", file=sys.stderr)
        sys.exit(2)

    from kit.config.loader import load_workload
    from kit.metrics.flops import model_flops_per_step
    from kit.plan.detect import detect_platform

    dp = args.gpus // args.tp
    device = "CPU (gloo)" if args.cpu else torch.cuda.get_device_name(0)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                            capture_output=True).stdout.strip() or "unknown"
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ} {device} x {args.gpus}; torch "
          f"{torch.__version__}, CUDA {torch.version.cuda}; commit {commit}; {args.workload} "
          f"tp {args.tp} dp {dp} sp, micro-batch {args.micro_batch}, global batch "
          f"{args.global_batch} ({args.global_batch // (args.micro_batch * dp)} micro-batches "
          f"per rank per step)\n$ python3 {shlex.join(sys.argv)}", flush=True)
    flops = model_flops_per_step(load_workload(args.workload), args.global_batch, args.tp)
    peak = None if args.cpu else detect_platform().peak_tflops.get("bf16")

    start = time.perf_counter()
    ref = reference(args)
    print(f"reference: {time.perf_counter() - start:.0f} s from launch to its figures")
    tflops = flops / ref["step_s"] / args.gpus / 1e12
    mfu = tflops / peak if peak else None
    figures = {"name": "torch_tp_compiled" if ref["compiled"] else "torch_tp_eager",
               "step_s": ref["step_s"], "step_s_mean": ref["step_s_mean"],
               "tflops_per_gpu": tflops, "mfu": mfu, "workload": args.workload, "tp": args.tp,
               "dp": dp, "sp": True, "micro_batch": args.micro_batch,
               "global_batch": args.global_batch, "device": device, "gpus": args.gpus,
               "date": f"{dt.date.today()}", "torch": torch.__version__, "commit": commit,
               "loss_first": ref["losses"][0], "loss_last": ref["losses"][-1],
               "shard": ref["shard"], "peak_mem_gib": ref["peak_mem_gib"],
               "gpu_idle_frac": None}
    print(f"shard: {ref['shard']}\nloss per step: "
          + " ".join(f"{x:.4f}" for x in ref["losses"]))
    if prof := ref["profile"]:
        idle = figures["gpu_idle_frac"] = prof["gpu_idle_frac"]
        print(f"profiled step (rank 0): {prof['step_s'] * 1e3:.1f} ms, GPU idle "
              + (f"{idle:.1%}" if idle is not None else "n/a") + "\n" + prof["table"])
    lines = [(figures["name"], figures)]
    if args.kit:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            kit = kit_run(args, dp, Path(tmp))
        print(f"kit: {time.perf_counter() - start:.0f} s from launch to its bundle")
        figures.update({"kit_step_s": kit["step_s"], "kit_tflops_per_gpu": kit["tflops_per_gpu"],
                        "kit_mfu": kit["mfu"], "kit_bundle": kit["bundle"],
                        "kit_args": args.kit_args,
                        "kit_over_ref": ref["step_s"] / kit["step_s"]})
        lines.append(("kit (megatron TP+SP)", kit))
    for label, row in lines:
        mfu_text = f"MFU {row['mfu']:6.1%}" if row["mfu"] is not None else "MFU n/a"
        print(f"{label:22s} {row['step_s'] * 1e3:9.1f} ms/step  "
              f"{row['tflops_per_gpu']:7.2f} TFLOP/s per GPU  {mfu_text}")
    if args.kit:
        print(f"kit / reference throughput: {figures['kit_over_ref']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
