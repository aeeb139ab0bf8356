"""Throughput of the kit's megatron engine against its ceilings, in one process on one GPU.

Measures, on the same model shape and batch:

1. ``gemm``: a large bf16 matmul, the practical ceiling of the tensor cores;
2. ``torch_ref``: a plain PyTorch GPT (nn.Linear, LayerNorm, SDPA flash attention, bf16
   autocast over fp32 weights, fused AdamW), the reference the kit must not be slower than;
   for a SwiGLU workload a plain PyTorch Llama instead (RMSNorm, RoPE, GQA, SwiGLU, untied
   output); ``torch_ref_compiled`` is the same with every block ``torch.compile``d
   (torchtitan's one-GPU recipe);
3. ``mcore_local``: megatron-core's stock local spec (its own DotProductAttention, no fusions,
   megatron's default optimizer), built through the kit's engine with the kit's changes off;
4. ``kit``: the kit's engine as ``charllm-kit run`` trains it: megatron, or with
   ``--engine deepspeed --zero N`` the deepspeed engine (``--ds-config`` merges a JSON object
   into the DeepSpeed config the kit writes, to try DeepSpeed's own knobs before they become
   the kit's defaults).

TFLOP/s use the kit's Megatron-LM formula (``kit.metrics.flops``), MFU the platform's dense
bf16 peak. Prints a table and, with ``--json``, writes the figures. ``--kit-variants`` adds
runs of the kit engine with a subset of its speed features (the run's ``--speed``), to show what
each one buys.

    python benchmarks/engine_throughput.py --json out.json
"""

import argparse
import contextlib
import datetime as dt
import gc
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kit.config.workload import WorkloadSpec, padded_vocab_size
from kit.engines.megatron import adapter
from kit.engines.megatron import model as kit_model
from kit.engines.registry import engine_spec
from kit.metrics.flops import model_flops_per_step
from kit.plan.detect import detect_platform
from kit.plan.resolve import RunRequest, resolve

GiB = 2**30


def _time_steps(step: Callable[[], Any], warmup: int, steps: int) -> float:
    """Mean seconds per call of ``step`` after ``warmup`` calls, synchronized."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


@contextlib.contextmanager
def fresh_memory() -> Iterator[None]:
    """Free what the previous measurement left and reset the peak counter."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    yield
    gc.collect()
    torch.cuda.empty_cache()


def gemm_tflops(n: int = 8192, steps: int = 50) -> float:
    """bf16 ``n x n x n`` matmul TFLOP/s."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    seconds = _time_steps(lambda: a @ b, 10, steps)
    return 2 * n**3 / seconds / 1e12


class _Block(nn.Module):
    """Pre-LN GPT block: fused QKV, SDPA causal flash attention, GELU MLP.

    The QKV output is laid out head by head (q, k, v of head 0, then of head 1, ...), as
    megatron-core lays it out, so a column shard of it holds whole heads and the block runs
    unchanged on a tensor-parallel shard (``benchmarks/parallel/tp_reference.py``).
    """

    def __init__(self, w: WorkloadSpec) -> None:
        super().__init__()
        h = w.hidden_size
        self.head_dim = h // w.num_attention_heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, w.ffn_hidden_size), nn.Linear(w.ffn_hidden_size, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(self.ln1(x))
        b, s = qkv.shape[:2]  # with sequence parallelism x holds a part of the sequence
        q, k, v = qkv.view(b, s, -1, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class TorchGPT(nn.Module):
    """The plain PyTorch reference: GPT with learned positions and tied embeddings; the
    vocabulary padded as megatron pads it for tensor-parallel degree ``tp``."""

    def __init__(self, w: WorkloadSpec, tp: int = 1) -> None:
        super().__init__()
        vocab = padded_vocab_size(w.vocab_size, tp)
        self.tok = nn.Embedding(vocab, w.hidden_size)
        self.pos = nn.Embedding(w.seq_length, w.hidden_size)
        self.blocks = nn.ModuleList(_Block(w) for _ in range(w.num_layers))
        self.ln = nn.LayerNorm(w.hidden_size)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy."""
        x = self.tok(tokens) + self.pos.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.ln(x) @ self.tok.weight.t()
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def _rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in megatron-core's (and Llama's Hugging Face) rotate-half layout."""
    t1, t2 = t.chunk(2, dim=-1)
    return torch.cat((t1 * cos - t2 * sin, t2 * cos + t1 * sin), dim=-1)


class _LlamaBlock(nn.Module):
    """Pre-RMSNorm Llama block: fused QKV with GQA, RoPE, SDPA causal attention, SwiGLU MLP."""

    def __init__(self, w: WorkloadSpec) -> None:
        super().__init__()
        h, self.heads, self.groups = w.hidden_size, w.num_attention_heads, w.query_groups
        d = h // self.heads
        self.norm1, self.norm2 = nn.RMSNorm(h, eps=1e-5), nn.RMSNorm(h, eps=1e-5)
        self.qkv = nn.Linear(h, (self.heads + 2 * self.groups) * d, bias=False)
        self.proj = nn.Linear(h, h, bias=False)
        self.gate_up = nn.Linear(h, 2 * w.ffn_hidden_size, bias=False)
        self.down = nn.Linear(w.ffn_hidden_size, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * d, self.groups * d, self.groups * d], dim=-1)
        q = _rope(q.view(b, s, self.heads, d).transpose(1, 2), cos, sin)
        k = _rope(k.view(b, s, self.groups, d).transpose(1, 2), cos, sin)
        v = v.view(b, s, self.groups, d).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TorchLlama(nn.Module):
    """The plain PyTorch reference for SwiGLU workloads: Llama with RoPE and an untied output."""

    def __init__(self, w: WorkloadSpec) -> None:
        super().__init__()
        vocab = padded_vocab_size(w.vocab_size)
        self.tok = nn.Embedding(vocab, w.hidden_size)
        self.blocks = nn.ModuleList(_LlamaBlock(w) for _ in range(w.num_layers))
        self.norm = nn.RMSNorm(w.hidden_size, eps=1e-5)
        self.out = nn.Linear(w.hidden_size, vocab, bias=False)
        d = w.hidden_size // w.num_attention_heads
        inv_freq = 1.0 / w.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        angles = torch.outer(torch.arange(w.seq_length, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy."""
        x = self.tok(tokens)
        s = tokens.shape[1]
        for block in self.blocks:
            x = block(x, self.cos[:s], self.sin[:s])
        logits = self.out(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def torch_reference(w: WorkloadSpec, micro: int, accum: int, warmup: int, steps: int,
                    compiled: bool = False) -> dict:
    """Seconds per step and peak memory of the plain reference (GPT, or Llama for SwiGLU);
    ``compiled``: every block ``torch.compile``d."""
    model = (TorchLlama(w) if w.activation == "swiglu" else TorchGPT(w)).cuda()
    if compiled:
        for block in model.blocks:
            block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    tokens = torch.randint(0, w.vocab_size, (accum, micro, w.seq_length + 1), device="cuda",
                           generator=gen)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        for m in range(accum):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(tokens[m, :, :-1], tokens[m, :, 1:]) / accum
            loss.backward()
        opt.step()

    seconds = _time_steps(step, warmup, steps)
    return {"step_s": seconds, "peak_mem_gib": torch.cuda.max_memory_allocated() / GiB}


@contextlib.contextmanager
def _stock_spec(stock: bool) -> Iterator[None]:
    """Run the kit engine with megatron's stock local layer spec when ``stock``."""
    old_spec = kit_model.layer_spec
    if stock:
        kit_model.layer_spec = lambda cfg: adapter.local_layer_spec(
            cfg.workload.num_experts, rms_norm=cfg.workload.normalization == "rmsnorm")
    try:
        yield
    finally:
        kit_model.layer_spec = old_spec


@contextlib.contextmanager
def _deepspeed_patch(patch: dict[str, Any]) -> Iterator[None]:
    """Merge ``patch`` into the deepspeed engine's config (top level and zero_optimization)."""
    from kit.engines.deepspeed import engine as ds_engine

    original = ds_engine.deepspeed_config

    def patched(cfg: Any) -> dict[str, Any]:
        config = original(cfg)
        for key, value in patch.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        return config

    ds_engine.deepspeed_config = patched
    try:
        yield
    finally:
        ds_engine.deepspeed_config = original


def kit_engine(req: RunRequest, speed: str | None = None,
               ds_patch: dict[str, Any] | None = None) -> dict:
    """Seconds per step and peak memory of the kit's engine (one rank) with the speed
    features ``speed`` (the run's ``--speed``; None: the default set)."""
    cfg = resolve(req.model_copy(update={"speed": speed}), require_present=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    engine = engine_spec(cfg.engine).build()
    with _deepspeed_patch(ds_patch or {}):
        engine.setup(cfg, 0, 0, 1)
    counter, losses = iter(range(10**9)), []

    def step() -> None:
        losses.append(engine.train_step(next(counter)).loss)

    try:
        seconds = _time_steps(step, req.warmup, req.steps)
        return {"step_s": seconds, "peak_mem_gib": torch.cuda.max_memory_allocated() / GiB,
                "last_loss": losses[-1], "notes": engine.info().notes}
    finally:
        engine.teardown()


def main() -> None:
    """Measure and print; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="gpt3-1.3b")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--only", default="gemm,torch_ref,mcore_local,kit",
                        help="of gemm,torch_ref,torch_ref_compiled,mcore_local,kit")
    parser.add_argument("--kit-variants", default="",
                        help="';'-separated --speed values measured besides the kit default")
    parser.add_argument("--engine", default="megatron", help="the kit engine to measure")
    parser.add_argument("--zero", type=int, default=0, help="deepspeed: ZeRO stage")
    parser.add_argument("--ds-config", default="{}",
                        help="deepspeed: JSON merged into the kit's DeepSpeed config")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    platform = detect_platform()
    req = RunRequest(workload=args.workload, platform=platform.name,
                     micro_batch_size=args.micro_batch, global_batch_size=args.global_batch,
                     steps=args.steps, warmup=args.warmup, telemetry_interval_ms=0,
                     engine=args.engine, zero=args.zero)
    ds_patch = json.loads(args.ds_config)
    cfg = resolve(req, require_present=True)
    flops = model_flops_per_step(cfg.workload, cfg.global_batch_size)
    peak = platform.peak_tflops["bf16"]
    only = set(args.only.split(","))
    device = torch.cuda.get_device_name()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ} {device}; torch {torch.__version__}, "
          f"megatron-core {adapter.mcore_version()}; {args.workload} micro-batch "
          f"{args.micro_batch} global {args.global_batch}, {flops / 1e12:.1f} TFLOP/step; kit "
          f"engine {args.engine}" + (f" ZeRO-{args.zero} {args.ds_config}"
                                     if args.engine == "deepspeed" else ""),
          flush=True)

    rows: dict[str, dict] = {}

    def measure(name: str, fn: Callable[[], dict], stock_spec: bool = False) -> None:
        """Run one measurement, print its line at once; out of memory is a result too."""
        with fresh_memory(), _stock_spec(stock_spec):
            try:
                row = fn()
            except torch.OutOfMemoryError:
                row = {"oom": True, "peak_mem_gib": torch.cuda.max_memory_allocated() / GiB}
            except Exception as exc:  # a variant that breaks is a result; the others still run
                row = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        rows[name] = row
        if "error" in row:
            print(f"{name:28s} failed: {row['error']}", flush=True)
            return
        if row.get("oom"):
            print(f"{name:28s} out of memory (peak {row['peak_mem_gib']:.2f} GiB)", flush=True)
            return
        if "step_s" in row:
            row["tflops"] = flops / row["step_s"] / 1e12
        row["mfu"] = row["tflops"] / peak
        line = f"{name:28s} {row['tflops']:7.1f} TFLOP/s  MFU {row['mfu']:6.1%}"
        if "step_s" in row:
            line += f"  {row['step_s'] * 1e3:7.1f} ms/step  peak {row['peak_mem_gib']:6.2f} GiB"
        if "last_loss" in row:
            line += f"  loss {row['last_loss']:.4f}"
        print(line, flush=True)

    if "gemm" in only:
        measure("gemm", lambda: {"tflops": gemm_tflops()})
    if "torch_ref" in only:
        measure("torch_ref", lambda: torch_reference(
            cfg.workload, cfg.micro_batch_size, cfg.grad_accum_steps, args.warmup, args.steps))
    if "torch_ref_compiled" in only:
        measure("torch_ref_compiled", lambda: torch_reference(
            cfg.workload, cfg.micro_batch_size, cfg.grad_accum_steps, args.warmup, args.steps,
            compiled=True))
    if "kit" in only:
        measure("kit", lambda: kit_engine(req, ds_patch=ds_patch))
    for variant in filter(None, args.kit_variants.split(";")):
        measure(f"kit[{variant}]", lambda: kit_engine(req, variant, ds_patch))
    if "mcore_local" in only:
        measure("mcore_local", lambda: kit_engine(req, "none"), stock_spec=True)
    if "kit" in rows and "tflops" in rows["kit"]:
        for name, row in rows.items():
            if name != "kit" and "tflops" in row:
                print(f"kit / {name}: {rows['kit']['tflops'] / row['tflops']:.2f}x")
    if "notes" in rows.get("kit", {}):
        print("kit notes: " + "; ".join(rows["kit"]["notes"]))
    if args.json:
        out = {"device": device, "date": f"{dt.date.today()}",
               "workload": args.workload, "micro_batch": args.micro_batch,
               "global_batch": args.global_batch, "torch": torch.__version__,
               "engine": args.engine, "zero": args.zero, "ds_config": ds_patch,
               "megatron_core": str(adapter.mcore_version()), "peak_tflops": peak}
        for key, name in (("gemm_tflops", "gemm"), ("torch_ref_tflops", "torch_ref"),
                          ("torch_ref_compiled_tflops", "torch_ref_compiled"),
                          ("mcore_local_tflops", "mcore_local"), ("kit_tflops", "kit")):
            out[key] = rows.get(name, {}).get("tflops")  # None: not run or out of memory
        out["kit_mfu"] = rows.get("kit", {}).get("mfu")
        out["kit_peak_mem_gib"] = rows.get("kit", {}).get("peak_mem_gib")
        out["torch_ref_peak_mem_gib"] = rows.get("torch_ref", {}).get("peak_mem_gib")
        out["variants"] = {k: {kk: v for kk, v in r.items() if kk != "notes"}
                           for k, r in rows.items()}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
