"""Compare the kit's attention and transformer layers with straightforward fp32 references.

Run as ``python -m tests.layer_numerics`` (one rank over gloo on the cpu platform, the way the
engine builds them). Prints one JSON line per check: ``{"check", "rel_err"}``, the largest
absolute difference over the largest reference magnitude (for a layer: of what it adds to its
input).
"""

import json
import math
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from megatron.core.tensor_parallel.layers import ColumnParallelLinear

from kit.config.loader import load_workload
from kit.engines.megatron.attention import SDPAttention
from kit.engines.megatron.engine import MegatronEngine
from kit.engines.megatron.linears import BiasAddColumnParallelLinear
from kit.plan.resolve import RunRequest, resolve


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax(q k^T / sqrt(d)) v with key/value heads repeated per query group.

    q ``[s, b, heads, d]``, k/v ``[s, b, groups, d]``; returns ``[s, b, heads * d]``.
    """
    s, b, heads, d = q.shape
    per_group = heads // k.shape[2]
    k, v = (t.repeat_interleave(per_group, dim=2) for t in (k, v))
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / math.sqrt(d)
    future = torch.ones(s, s, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(-1)
    return torch.einsum("bhst,tbhd->sbhd", probs, v).reshape(s, b, heads * d)


def reference_layer(layer: torch.nn.Module, x: torch.Tensor, cfg) -> torch.Tensor:
    """One pre-norm transformer layer written out from ``layer``'s weights."""
    w = cfg.workload
    heads, groups = w.num_attention_heads, w.query_groups
    d = w.hidden_size // heads

    def norm(module: torch.nn.Module, t: torch.Tensor) -> torch.Tensor:
        if w.normalization == "rmsnorm":
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + module.eps) * module.weight
        return F.layer_norm(t, (t.shape[-1],), module.weight, module.bias, module.eps)

    def linear(module: torch.nn.Module, t: torch.Tensor) -> torch.Tensor:
        return F.linear(t, module.weight, module.bias)

    attn = layer.self_attention
    s, b, _ = x.shape
    qkv = linear(attn.linear_qkv, norm(layer.input_layernorm, x))
    qkv = qkv.view(s, b, groups, (heads // groups + 2) * d)  # megatron's per-group layout
    q, k, v = qkv.split([heads // groups * d, d, d], dim=-1)
    q = q.reshape(s, b, heads, d)
    x = x + linear(attn.linear_proj, reference_attention(q, k, v))
    mlp = layer.mlp
    h = linear(mlp.linear_fc1, norm(layer.pre_mlp_layernorm, x))
    if w.activation == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        h = F.silu(gate) * up
    else:
        h = F.gelu(h)
    return x + linear(mlp.linear_fc2, h)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def checks(workload: str) -> list[dict[str, object]]:
    """Attention and first-layer checks for one workload (name or YAML path)."""
    cfg = resolve(RunRequest(workload=workload, platform="cpu"))
    engine = MegatronEngine()
    engine.setup(cfg, rank=0, local_rank=0, world_size=1)
    try:
        w = cfg.workload
        torch.manual_seed(0)
        s, b, d = w.seq_length, 2, w.hidden_size // w.num_attention_heads
        q = torch.randn(s, b, w.num_attention_heads, d)
        k, v = (torch.randn(s, b, w.query_groups, d) for _ in range(2))
        core = SDPAttention(engine.config, layer_number=1, attn_mask_type=None,
                            attention_type="self")
        with torch.no_grad():
            attention = _rel_err(core(q, k, v, None), reference_attention(q, k, v))
            layer = engine.model[0].module.decoder.layers[0]
            x = torch.randn(s, b, w.hidden_size)
            out = layer(x, attention_mask=None)
            out = out[0] if isinstance(out, tuple) else out
            # compare what the layer adds to its input: the residual stream would hide errors
            layer_err = _rel_err(out - x, reference_layer(layer, x, cfg) - x)
        rows = [{"check": f"{w.name} attention", "rel_err": attention},
                {"check": f"{w.name} layer", "rel_err": layer_err}]
        if w.add_bias_linear:
            rows.append({"check": f"{w.name} bias-add qkv",
                         "rel_err": _bias_add_linear_err(layer.self_attention.linear_qkv, x)})
    finally:
        engine.teardown()
    return rows


def _bias_add_linear_err(stock: torch.nn.Module, x: torch.Tensor) -> float:
    """The GPU path's QKV linear against megatron's: output, input/weight/bias gradients.

    Both are built fresh with the stock layer's weights (the stock layer's own parameters
    hand their gradients to DDP's buffers).
    """
    results = []
    for cls in (ColumnParallelLinear, BiasAddColumnParallelLinear):
        module = cls(stock.input_size, stock.output_size, config=stock.config,
                     init_method=lambda t: None, gather_output=False, bias=True,
                     skip_bias_add=False)
        with torch.no_grad():
            module.weight.copy_(stock.weight)
            module.bias.copy_(stock.bias)
        inp = x.clone().requires_grad_()
        out, bias = module(inp)
        assert bias is None
        out.pow(2).sum().backward()
        results.append((out, inp.grad, module.weight.grad, module.bias.grad))
    return max(_rel_err(got, want) for got, want in zip(results[1], results[0], strict=True))


def llama_tiny(directory: Path) -> Path:
    """mixtral-tiny without experts: a dense Llama-style layer (GQA, SwiGLU, RMSNorm)."""
    spec = load_workload("mixtral-tiny").model_dump(exclude_none=True)
    spec.update(name="llama-tiny", family="llama3")
    spec.pop("num_experts", None)
    spec.pop("moe_top_k", None)
    path = directory / "llama-tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", sys.argv[1] if len(sys.argv) > 1 else "29533")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("gpt3-tiny", str(llama_tiny(Path(tmp)))):
            for row in checks(name):
                print(json.dumps(row), flush=True)
