"""The kit's workloads as plain PyTorch causal language models, built layer by layer.

One recipe (:func:`layer_recipes`) lists the layers of a workload in order; :class:`CausalLM`
builds all of them in one process (for ZeRO) and :func:`pipeline_module` hands the same
recipe to DeepSpeed's ``PipelineModule``, which builds only the layers of its own stage.
Every layer draws its initial weights from a generator seeded by (run seed, layer index), so
both paths start from identical weights and a pipelined run can be compared with an unsplit one.

Initialization follows megatron-core's defaults in distribution (not in values: megatron
draws the whole model from one stream in its own order): weights N(0, 0.02), the output
projections of attention and MLP N(0, 0.02 / sqrt(2 L)), zero biases, unit norm weights.
Attention is ``torch.nn.functional.scaled_dot_product_attention`` (causal, grouped-query
heads without repeating key/value); RoPE rotates the two halves of each head, as megatron does.
"""

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kit.spec.workload import WorkloadSpec

INIT_STD = 0.02
NORM_EPS = 1e-5
MOE_AUX_LOSS_COEFF = 1e-2
"""Weight of the router's load-balancing loss, megatron's ``moe_aux_loss_coeff`` in the kit."""


def layer_seed(seed: int, index: int) -> int:
    """Seed of the generator that initializes layer ``index`` of a model seeded with ``seed``."""
    return seed * 100_003 + index


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Run the block with torch's CPU generator at ``seed``, restoring its state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _init_linear(layer: nn.Linear, std: float) -> None:
    nn.init.normal_(layer.weight, mean=0.0, std=std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


def _norm(w: WorkloadSpec) -> nn.Module:
    if w.normalization == "rmsnorm":
        return nn.RMSNorm(w.hidden_size, eps=NORM_EPS)
    return nn.LayerNorm(w.hidden_size, eps=NORM_EPS)


def _output_std(w: WorkloadSpec) -> float:
    return INIT_STD / math.sqrt(2.0 * w.num_layers)


def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Apply rotary position embedding to ``x`` of shape [batch, heads, seq, head_dim]."""
    s, d = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads and optional RoPE."""

    def __init__(self, w: WorkloadSpec) -> None:
        super().__init__()
        self.heads, self.groups = w.num_attention_heads, w.query_groups
        self.head_dim = w.hidden_size // w.num_attention_heads
        self.rope_theta = w.rope_theta if w.position_embedding == "rope" else None
        kv = self.groups * self.head_dim
        self.qkv = nn.Linear(w.hidden_size, self.heads * self.head_dim + 2 * kv, w.add_bias_linear)
        self.proj = nn.Linear(self.heads * self.head_dim, w.hidden_size, w.add_bias_linear)
        _init_linear(self.qkv, INIT_STD)
        _init_linear(self.proj, _output_std(w))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, hidden] -> [batch, seq, hidden]."""
        b, s, _ = x.shape
        d = self.head_dim
        q, k, v = self.qkv(x).split([self.heads * d, self.groups * d, self.groups * d], dim=-1)
        q = q.view(b, s, self.heads, d).transpose(1, 2)
        k = k.view(b, s, self.groups, d).transpose(1, 2)
        v = v.view(b, s, self.groups, d).transpose(1, 2)
        if self.rope_theta is not None:
            q, k = _rotate(q, self.rope_theta), _rotate(k, self.rope_theta)
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.heads != self.groups
        )
        return self.proj(out.transpose(1, 2).reshape(b, s, self.heads * d))


class MLP(nn.Module):
    """Feed-forward block: GELU, or SwiGLU (one h -> 2f GEMM split into gate and value)."""

    def __init__(self, w: WorkloadSpec) -> None:
        super().__init__()
        self.gated = w.activation == "swiglu"
        width = w.ffn_hidden_size * (2 if self.gated else 1)
        self.fc1 = nn.Linear(w.hidden_size, width, w.add_bias_linear)
        self.fc2 = nn.Linear(w.ffn_hidden_size, w.hidden_size, w.add_bias_linear)
        _init_linear(self.fc1, INIT_STD)
        _init_linear(self.fc2, _output_std(w))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., hidden]."""
        y = self.fc1(x)
        if self.gated:
            gate, value = y.chunk(2, dim=-1)
            y = F.silu(gate) * value
        else:
            y = F.gelu(y)
        return self.fc2(y)


class MoEMLP(nn.Module):
    """DeepSpeed's MoE layer (top-k gate, no token dropping) with :class:`MLP` experts.

    The router's load-balancing loss of the last forward is kept in ``aux_loss`` for the model
    to add to the training loss (megatron adds it in backward only, so it never shows in the
    reported language-model loss; the kit reports the same).
    """

    def __init__(self, w: WorkloadSpec) -> None:
        super().__init__()
        from deepspeed.moe.layer import MoE

        assert w.num_experts is not None
        self.moe = MoE(
            hidden_size=w.hidden_size,
            expert=MLP(w),
            num_experts=w.num_experts,
            ep_size=1,
            k=w.moe_top_k,
            drop_tokens=False,
            use_rts=False,
            top2_2nd_expert_sampling=False,
        )
        # DeepSpeed deep-copies one expert: give each its own initial weights.
        for expert in self.moe.deepspeed_moe.experts.deepspeed_experts:
            _init_linear(expert.fc1, INIT_STD)
            _init_linear(expert.fc2, _output_std(w))
        _init_linear(self.moe.deepspeed_moe.gate.wg, INIT_STD)
        self.aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, hidden] -> [batch, seq, hidden]; stores the router loss."""
        out, aux_loss, _ = self.moe(x)
        self.aux_loss = aux_loss
        return out


class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, w: WorkloadSpec, init_seed: int) -> None:
        super().__init__()
        with _seeded(init_seed):
            self.attn_norm = _norm(w)
            self.attn = Attention(w)
            self.mlp_norm = _norm(w)
            self.mlp = MoEMLP(w) if w.is_moe else MLP(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, hidden] -> [batch, seq, hidden]."""
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class WordEmbedding(nn.Module):
    """Token embedding; with tied embeddings its weight also produces the logits."""

    def __init__(self, w: WorkloadSpec, vocab_size: int, init_seed: int) -> None:
        super().__init__()
        with _seeded(init_seed):
            self.weight = nn.Parameter(torch.empty(vocab_size, w.hidden_size))
            nn.init.normal_(self.weight, mean=0.0, std=INIT_STD)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """[batch, seq] token ids -> [batch, seq, hidden]."""
        return F.embedding(tokens, self.weight)


def tied_logits(embedding: WordEmbedding, x: torch.Tensor) -> torch.Tensor:
    """Logits from the input embedding's weight (tied embeddings)."""
    return F.linear(x, embedding.weight)


class PositionEmbedding(nn.Module):
    """Learned absolute positions added to the token embeddings (GPT-3)."""

    def __init__(self, w: WorkloadSpec, init_seed: int) -> None:
        super().__init__()
        with _seeded(init_seed):
            self.weight = nn.Parameter(torch.empty(w.seq_length, w.hidden_size))
            nn.init.normal_(self.weight, mean=0.0, std=INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, hidden] -> the same plus each position's embedding."""
        return x + self.weight[: x.shape[1]]


class FinalNorm(nn.Module):
    """The norm after the last transformer layer."""

    def __init__(self, w: WorkloadSpec) -> None:
        super().__init__()
        self.norm = _norm(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize the last hidden states."""
        return self.norm(x)


class OutputLayer(nn.Module):
    """Untied output projection to the (padded) vocabulary."""

    def __init__(self, w: WorkloadSpec, vocab_size: int, init_seed: int) -> None:
        super().__init__()
        with _seeded(init_seed):
            self.weight = nn.Parameter(torch.empty(vocab_size, w.hidden_size))
            nn.init.normal_(self.weight, mean=0.0, std=INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, hidden] -> [batch, seq, vocab] logits."""
        return F.linear(x, self.weight)


@dataclass(frozen=True)
class LayerRecipe:
    """One layer of a model in order: its class, constructor arguments and weight tying."""

    cls: type[nn.Module]
    kwargs: dict[str, Any]
    tie_key: str | None = None
    """Layers with the same key share one module (DeepSpeed's ``TiedLayerSpec`` key)."""
    forward_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None = field(default=None)
    """How a repeated tied layer is applied (None: call the module)."""


def layer_recipes(w: WorkloadSpec, vocab_size: int, seed: int) -> list[LayerRecipe]:
    """The layers of ``w`` from tokens to logits, each with its own init seed."""
    word = dict(w=w, vocab_size=vocab_size, init_seed=layer_seed(seed, 0))
    tie = "word_embedding" if w.tie_embeddings else None
    out = [LayerRecipe(WordEmbedding, word, tie)]
    if w.position_embedding == "learned_absolute":
        out.append(LayerRecipe(PositionEmbedding, dict(w=w, init_seed=layer_seed(seed, 1))))
    out += [
        LayerRecipe(Block, dict(w=w, init_seed=layer_seed(seed, 2 + i)))
        for i in range(w.num_layers)
    ]
    out.append(LayerRecipe(FinalNorm, dict(w=w)))
    if w.tie_embeddings:
        out.append(LayerRecipe(WordEmbedding, word, tie, forward_fn=tied_logits))
    else:
        out.append(LayerRecipe(
            OutputLayer,
            dict(w=w, vocab_size=vocab_size, init_seed=layer_seed(seed, 2 + w.num_layers)),
        ))
    return out


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over every token, computed in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


class CausalLM(nn.Module):
    """All layers of a workload in one process; returns the loss to train on.

    Args:
        w: The architecture.
        vocab_size: Padded vocabulary size.
        seed: Run seed (each layer's init seed derives from it).
        recompute: Recompute each transformer layer's activations in backward (full
            recomputation, one layer per checkpoint).
    """

    def __init__(self, w: WorkloadSpec, vocab_size: int, seed: int, recompute: bool) -> None:
        super().__init__()
        self.recompute = recompute
        tied: dict[str, nn.Module] = {}
        self.layers = nn.ModuleList()
        self._forward_fns: list[Callable[[Any, torch.Tensor], torch.Tensor] | None] = []
        for recipe in layer_recipes(w, vocab_size, seed):
            if recipe.tie_key is not None and recipe.tie_key in tied:
                module = tied[recipe.tie_key]
            else:
                module = recipe.cls(**recipe.kwargs)
                if recipe.tie_key is not None:
                    tied[recipe.tie_key] = module
            self.layers.append(module)
            self._forward_fns.append(recipe.forward_fn)

    def forward(
        self, tokens: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Language-model loss, and the MoE router loss (None for a dense model)."""
        x = tokens
        for layer, fn in zip(self.layers, self._forward_fns, strict=True):
            if fn is not None:
                x = fn(layer, x)
            elif self.recompute and isinstance(layer, Block):
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        aux = [m.aux_loss for m in self.modules() if isinstance(m, MoEMLP)]
        return lm_loss(x, labels), (torch.stack(aux).sum() if aux else None)


def pipeline_module(
    w: WorkloadSpec,
    vocab_size: int,
    seed: int,
    stages: int,
    recompute: bool,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Any:
    """DeepSpeed ``PipelineModule`` over :func:`layer_recipes`, transformer layers split evenly.

    Tied embeddings become a ``TiedLayerSpec`` on the first and last stage; DeepSpeed copies
    the first stage's weight to the last at construction and all-reduces their gradients.
    With ``recompute`` every transformer layer is one activation checkpoint.
    """
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    specs = []
    for r in layer_recipes(w, vocab_size, seed):
        if r.tie_key is None:
            specs.append(LayerSpec(r.cls, **r.kwargs))
        else:
            specs.append(TiedLayerSpec(
                r.tie_key, r.cls, **r.kwargs, forward_fn=r.forward_fn, tied_weight_attr=["weight"]
            ))
    return PipelineModule(
        layers=specs,
        num_stages=stages,
        loss_fn=loss_fn,
        partition_method="type:Block",
        activation_checkpoint_interval=1 if recompute else 0,
        # only transformer layers: DeepSpeed's reentrant checkpoint would cut the embedding's
        # gradient (its input, token ids, needs no grad)
        checkpointable_layers=[Block.__name__],
    )
