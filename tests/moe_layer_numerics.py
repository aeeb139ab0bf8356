"""One rank of the MoE-layer check: megatron-core's MoE layer as the kit builds it against a
plain PyTorch loop over the experts, forward and backward, fp32 on CPU over gloo.

Run as ``python -m tests.moe_layer_numerics RANK WORLD PORT EP`` (one process per rank). Each
rank builds mixtral-tiny through the megatron engine (``--ep EP``, alltoall dispatcher, the
learned router with its load-balancing loss), takes the first layer's MoE block and feeds it
its own random tokens. The reference is written out from the same weights: router logits,
top-k, softmax over the chosen logits, every expert's SwiGLU MLP on its tokens weighted by
their probabilities, and the switch load-balancing loss
``E * coeff / (k * T^2) * sum_e tokens_e * sum_t softmax(logits)_te``. Backward runs
``sum(output * g) + aux loss`` in both. Compared: the output, the input gradient, the router
weight gradient and every local expert's weight gradients (under EP an expert's gradient comes
from every rank's tokens, so the reference's per-rank gradients are summed over the EP group),
for megatron-core's ``SequentialMLP`` and for the kit's grouped-GEMM experts put in its place
with the same weights. Prints one JSON line per check: ``{"check", "rank", "rel_err"}``, the
largest absolute difference over the largest reference magnitude, and per implementation the
load-balancing loss's share of the router gradient (``"share"``: its largest element over the
whole gradient's), which shows the router comparison would see that loss go missing.
"""

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from kit.engines.megatron.engine import MegatronEngine
from kit.engines.megatron.grouped_mlp import GroupedMLP
from kit.plan.resolve import RunRequest, resolve


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def reference(x: torch.Tensor, router_w: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
              top_k: int, coeff: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain MoE: (output [tokens, hidden], switch load-balancing loss) of tokens ``x``.

    ``router_w`` [experts, hidden]; ``w1`` [experts, 2 * ffn, hidden] (gate rows, then up
    rows); ``w2`` [experts, hidden, ffn].
    """
    experts = router_w.shape[0]
    logits = x @ router_w.t()
    chosen, index = torch.topk(logits, top_k, dim=-1)
    probs = torch.softmax(chosen, dim=-1)
    out = torch.zeros_like(x)
    counts = torch.zeros(experts)
    for e in range(experts):
        token, slot = torch.nonzero(index == e, as_tuple=True)
        counts[e] = len(token)
        gate, up = (x[token] @ w1[e].t()).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ w2[e].t()
        out = out.index_add(0, token, y * probs[token, slot].unsqueeze(-1))
    tokens = x.shape[0]
    scores = torch.softmax(logits, dim=-1)
    aux = (scores.sum(0) * counts).sum() * experts * coeff / (top_k * tokens * tokens)
    return out, aux


def _expert_weights(experts: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """This rank's experts' fc1 and fc2 weights, as parameters, in local expert order."""
    if isinstance(experts, GroupedMLP):
        return [experts.weight1], [experts.weight2]
    return ([m.linear_fc1.weight for m in experts.local_experts],
            [m.linear_fc2.weight for m in experts.local_experts])


def _grad(p: torch.Tensor) -> torch.Tensor:
    """The gradient megatron DDP accumulated for ``p`` (``main_grad``), else ``p.grad``."""
    return p.main_grad if getattr(p, "main_grad", None) is not None else p.grad


def checks(engine: MegatronEngine, moe: Any, tag: str, rank: int, ep_group: Any) -> list[dict]:
    """Run the layer and the reference on this rank's tokens; the rows to print."""
    from megatron.core.pipeline_parallel.schedules import custom_backward
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    cfg = engine.cfg
    assert cfg is not None
    w = cfg.workload
    for chunk in engine.model:
        chunk.zero_grad_buffer()
    for p in moe.parameters():
        p.grad = None
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(w.seq_length, 2, w.hidden_size, generator=gen)
    # small output gradients, so the load-balancing loss is a visible part of the router's
    g = 1e-3 * torch.randn(w.seq_length, 2, w.hidden_size, generator=gen)
    x_layer = x.clone().requires_grad_()
    out, bias = moe(x_layer)
    assert bias is None
    # as megatron's schedule does (custom_backward): the kit's CPU mode stays on in backward
    custom_backward((out * g).sum(), None)

    fc1, fc2 = _expert_weights(moe.experts)
    local_w1 = torch.cat([p.detach().reshape(-1, *p.shape[-2:]) for p in fc1])
    local_w2 = torch.cat([p.detach().reshape(-1, *p.shape[-2:]) for p in fc2])
    ep = dist.get_world_size(ep_group)
    w1_all = [torch.empty_like(local_w1) for _ in range(ep)]
    w2_all = [torch.empty_like(local_w2) for _ in range(ep)]
    dist.all_gather(w1_all, local_w1.contiguous(), group=ep_group)
    dist.all_gather(w2_all, local_w2.contiguous(), group=ep_group)
    router_w = moe.router.weight.detach().clone().requires_grad_()
    w1 = torch.cat(w1_all).requires_grad_()
    w2 = torch.cat(w2_all).requires_grad_()
    x_ref = x.reshape(-1, w.hidden_size).clone().requires_grad_()
    ref_out, aux = reference(x_ref, router_w, w1, w2, w.moe_top_k,
                             engine.config.moe_aux_loss_coeff)
    (aux_grad,) = torch.autograd.grad(aux, router_w, retain_graph=True)
    ((ref_out * g.reshape(ref_out.shape)).sum() + aux).backward()

    local = local_w1.shape[0]
    ep_rank = dist.get_rank(ep_group)
    w1_grad, w2_grad = w1.grad.clone(), w2.grad.clone()
    dist.all_reduce(w1_grad, group=ep_group)  # each expert learns from every rank's tokens
    dist.all_reduce(w2_grad, group=ep_group)
    mine = slice(ep_rank * local, (ep_rank + 1) * local)
    got_w1 = torch.cat([_grad(p).reshape(-1, *p.shape[-2:]) for p in fc1])
    got_w2 = torch.cat([_grad(p).reshape(-1, *p.shape[-2:]) for p in fc2])
    pairs = {
        "output": (out.reshape(ref_out.shape), ref_out),
        "input grad": (x_layer.grad.reshape(ref_out.shape), x_ref.grad),
        "router weight grad": (_grad(moe.router.weight), router_w.grad),
        "fc1 weight grad": (got_w1, w1_grad[mine]),
        "fc2 weight grad": (got_w2, w2_grad[mine]),
    }
    rows = [{"check": f"{tag} {name}", "rank": rank, "rel_err": _rel_err(a.detach(), b)}
            for name, (a, b) in pairs.items()]
    # how much the load-balancing loss moves the router's gradient: the comparison above would
    # miss a layer that dropped it only if this were below its tolerance
    share = float(aux_grad.abs().max() / router_w.grad.abs().max())
    return [*rows, {"check": f"{tag} aux loss share of router grad", "rank": rank,
                    "share": share}]


def grouped_like(moe: Any, engine: MegatronEngine) -> GroupedMLP:
    """The kit's grouped-GEMM experts with the weights of ``moe``'s ``SequentialMLP``."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    experts = moe.experts
    grouped = GroupedMLP(experts.num_local_experts, engine.config,
                         pg_collection=ProcessGroupCollection.use_mpu_process_groups())
    with torch.no_grad():
        for e, mlp in enumerate(experts.local_experts):
            grouped.weight1[e].copy_(mlp.linear_fc1.weight)
            grouped.weight2[e].copy_(mlp.linear_fc2.weight)
    return grouped


def main(rank: int, world: int, port: str, ep: int) -> None:
    """Build the engine on this rank, check both expert implementations, print the rows."""
    from megatron.core import parallel_state as ps

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    cfg = resolve(RunRequest(workload="mixtral-tiny", platform="cpu", dp=world, ep=ep))
    engine = MegatronEngine()
    engine.setup(cfg, rank=rank, local_rank=rank, world_size=world)
    try:
        moe = engine.model[0].module.decoder.layers[0].mlp
        ep_group = ps.get_expert_model_parallel_group()
        rows = checks(engine, moe, "sequential", rank, ep_group)
        if hasattr(torch, "_grouped_mm"):
            moe.experts = grouped_like(moe, engine)
            rows += checks(engine, moe, "grouped", rank, ep_group)
        for row in rows:
            print(json.dumps(row), flush=True)
    finally:
        engine.teardown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
