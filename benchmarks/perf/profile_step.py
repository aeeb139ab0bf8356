"""Where one training step's GPU time goes: the kit engine and the plain PyTorch reference.

Profiles one step (after warmup) with torch.profiler and prints the top CUDA kernels and the
time per kernel category (GEMM, attention, elementwise/reduction, optimizer, communication).

    python benchmarks/perf/profile_step.py [--what kit,torch_ref]
"""

import argparse
import os
import socket
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.engine_throughput import TorchGPT
from kit.engines.megatron.engine import MegatronEngine
from kit.plan.detect import detect_platform
from kit.plan.resolve import RunRequest, resolve

CATEGORIES = (("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")),
              ("attention", ("flash", "fmha", "attention")),
              ("optimizer", ("adam", "multi_tensor")),
              ("communication", ("nccl",)))


def _category(name: str) -> str:
    low = name.lower()
    return next((c for c, keys in CATEGORIES if any(k in low for k in keys)), "other")


def _profile(label: str, step: Callable[[], None]) -> None:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events)
    by_cat: dict[str, float] = defaultdict(float)
    for e in events:
        by_cat[_category(e.key)] += e.self_device_time_total
    print(f"== {label}: {total / 1e3:.1f} ms of kernels")
    for cat, us in sorted(by_cat.items(), key=lambda kv: -kv[1]):
        print(f"   {cat:14s} {us / 1e3:8.1f} ms  {us / total:6.1%}")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:25]:
        print(f"   {e.self_device_time_total / 1e3:8.2f} ms  x{e.count:<5d} {e.key[:110]}")


def main() -> None:
    """Profile what ``--what`` names."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--what", default="kit,torch_ref")
    parser.add_argument("--workload", default="gpt3-1.3b")
    parser.add_argument("--speed", help="the kit engine's speed features (run's --speed)")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=16)
    args = parser.parse_args()
    req = RunRequest(workload=args.workload, platform=detect_platform().name,
                     micro_batch_size=args.micro_batch, global_batch_size=args.global_batch,
                     telemetry_interval_ms=0, speed=args.speed)
    cfg = resolve(req, require_present=True)
    if "kit" in args.what:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        engine = MegatronEngine()
        engine.setup(cfg, 0, 0, 1)
        counter = iter(range(10**9))
        _profile(f"kit ({args.speed or 'default'})",
                 lambda: engine.train_step(next(counter)))
        engine.teardown()
        del engine
        torch.cuda.empty_cache()
    if "torch_ref" in args.what:
        w = cfg.workload
        model = TorchGPT(w).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
        tokens = torch.randint(0, w.vocab_size, (4, 4, w.seq_length + 1), device="cuda")

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            for m in range(4):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(tokens[m, :, :-1], tokens[m, :, 1:]) / 4
                loss.backward()
            opt.step()

        _profile("torch_ref", step)


if __name__ == "__main__":
    main()
