"""Compare the kit's grouped-GEMM experts with megatron-core's ``SequentialMLP``, fp32 on CPU.

Run as ``python -m tests.grouped_mlp_numerics [port]`` (one rank over gloo on the cpu platform,
the way the engine builds it). Both modules are built fresh from mixtral-tiny's config with the
same weights, run on the same permuted tokens (one expert gets none), and backpropagate the same
gradient. Prints one JSON line per compared tensor: ``{"check", "rel_err"}``, the largest
absolute difference over the largest reference magnitude.
"""

import copy
import json
import os
import sys

import torch

from kit.engines.megatron import adapter
from kit.engines.megatron import model as kit_model
from kit.engines.megatron.engine import MegatronEngine
from kit.engines.megatron.grouped_mlp import GroupedMLP
from kit.plan.resolve import RunRequest, resolve


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def _run(module: torch.nn.Module, x: torch.Tensor, counts: torch.Tensor, probs: torch.Tensor,
         grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Output, input gradient and router-probability gradient of one forward and backward."""
    x, probs = x.clone().requires_grad_(), probs.clone().requires_grad_()
    out, bias = module(x, counts, probs)
    assert bias is None
    out.backward(grad)
    return out, x.grad, probs.grad


def checks(fused_activation: bool, wgrad_into_main_grad: bool) -> list[dict[str, object]]:
    """Output and every gradient; ``fused_activation``: megatron's weighted SwiGLU kernel;
    ``wgrad_into_main_grad``: weight gradients added into an fp32 ``main_grad`` as under
    megatron DDP with ``gradient_accumulation_fusion``."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    cfg = resolve(RunRequest(workload="mixtral-tiny", platform="cpu"))
    engine = MegatronEngine()
    engine.setup(cfg, rank=0, local_rank=0, world_size=1)
    try:
        config = copy.copy(engine.config)
        config.bias_activation_fusion = fused_activation
        pgs = ProcessGroupCollection.use_mpu_process_groups()
        experts = cfg.workload.num_experts
        torch.manual_seed(0)
        sequential = adapter.build_experts(kit_model.layer_spec(cfg), experts, config, pgs)
        config = copy.copy(config)  # SequentialMLP's linears keep plain gradients
        config.gradient_accumulation_fusion = wgrad_into_main_grad
        grouped = GroupedMLP(experts, config, pg_collection=pgs)
        with torch.no_grad():
            for e, mlp in enumerate(sequential.local_experts):
                grouped.weight1[e].copy_(mlp.linear_fc1.weight)
                grouped.weight2[e].copy_(mlp.linear_fc2.weight)
        counts = torch.tensor([7, 0, 13, 4] + [5] * (experts - 4))
        tokens = int(counts.sum())
        x = torch.randn(tokens, cfg.workload.hidden_size)
        probs = torch.rand(tokens)
        grad = torch.randn(tokens, cfg.workload.hidden_size)
        for weight in (grouped.weight1, grouped.weight2):
            if wgrad_into_main_grad:  # what megatron DDP attaches; holds an earlier micro-batch's
                weight.main_grad = torch.ones_like(weight, dtype=torch.float32)
                weight.grad_added_to_main_grad = False
        want = _run(sequential, x, counts, probs, grad)
        got = _run(grouped, x, counts, probs, grad)
        fc1 = torch.stack([m.linear_fc1.weight.grad for m in sequential.local_experts])
        fc2 = torch.stack([m.linear_fc2.weight.grad for m in sequential.local_experts])
        assert not fc1[1].any(), "an expert without tokens has no fc1 gradient"
        tag = "fused" if fused_activation else "plain"
        weight_grads = (grouped.weight1.grad, grouped.weight2.grad)
        if wgrad_into_main_grad:
            tag = "main_grad"
            assert all(w.grad_added_to_main_grad for w in (grouped.weight1, grouped.weight2))
            weight_grads = (grouped.weight1.main_grad - 1, grouped.weight2.main_grad - 1)
        pairs = {"output": (got[0], want[0]), "input grad": (got[1], want[1]),
                 "probs grad": (got[2], want[2]), "fc1 weight grad": (weight_grads[0], fc1),
                 "fc2 weight grad": (weight_grads[1], fc2)}
        return [{"check": f"{tag} {name}", "rel_err": _rel_err(g, w)}
                for name, (g, w) in pairs.items()]
    finally:
        engine.teardown()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", sys.argv[1] if len(sys.argv) > 1 else "29534")
    for fused, main_grad in ((False, False), (True, False), (True, True)):
        for row in checks(fused, main_grad):
            print(json.dumps(row), flush=True)
