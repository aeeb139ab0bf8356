"""The kit's workloads as plain PyTorch causal language models, built layer by layer.

One recipe (:func:`layer_recipes`) lists the layers of a workload in order; :class:`CausalLM`
builds all of them in one process (for ZeRO) and :func:`pipeline_module` hands the same
recipe to DeepSpeed's ``PipelineModule``, which builds only the layers of its own stage.
Every layer draws its initial weights (on the CPU; on a CUDA platform on the GPU, see
:func:`drawing_on`) from its own generator seeded by (run seed, layer index), inside the
constructor of the module that owns them, so every path starts from
identical weights: all layers in one process, one pipeline stage's layers, or a model built
under ZeRO-3's ``deepspeed.zero.Init`` (which partitions each module's parameters as soon as
its constructor returns, and may allocate them on the GPU).

Initialization follows megatron-core's defaults in distribution (not in values: megatron
draws the whole model from one stream in its own order): weights N(0, 0.02), the output
projections of attention and MLP N(0, 0.02 / sqrt(2 L)), zero biases, unit norm weights.
Attention is ``torch.nn.functional.scaled_dot_product_attention`` (causal, grouped-query
heads without repeating key/value); RoPE rotates the two halves of each head, as megatron does.
"""

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from kit.config.workload import WorkloadSpec

INIT_STD = 0.02
NORM_EPS = 1e-5
MOE_AUX_LOSS_COEFF = 1e-2
"""Weight of the router's load-balancing loss, megatron's ``moe_aux_loss_coeff`` in the kit."""


def layer_seed(seed: int, index: int) -> int:
    """Seed of the generator that initializes layer ``index`` of a model seeded with ``seed``."""
    return seed * 100_003 + index


_DRAW_DEVICE = torch.device("cpu")
"""Where layer generators draw (:func:`drawing_on`): the CPU unless the engine says CUDA."""


@contextmanager
def drawing_on(device: torch.device) -> Iterator[None]:
    """Draw initial weights on ``device`` while building a model (the engine's device on CUDA).

    The CPU draws some 10-100 M normal values per second (seconds of every rank's model build
    for a 1.3B-parameter model, under ZeRO-3 too, where each rank keeps a shard of each draw);
    a CUDA generator draws them in milliseconds. Every path of one platform draws on
    the same device, so all of them still start from identical weights (the values differ
    from the CPU's: another generator).
    """
    global _DRAW_DEVICE
    previous, _DRAW_DEVICE = _DRAW_DEVICE, torch.device(device)
    try:
        yield
    finally:
        _DRAW_DEVICE = previous


def layer_generator(init_seed: int) -> torch.Generator:
    """The generator a layer draws its weights from, on the device of :func:`drawing_on`."""
    return torch.Generator(device=_DRAW_DEVICE).manual_seed(init_seed)


def _fill_normal(param: torch.Tensor, std: float, gen: torch.Generator) -> None:
    """Fill ``param`` with N(0, std) drawn from ``gen`` on its device, whatever device holds
    ``param``."""
    with torch.no_grad():
        draw = torch.randn(param.shape, generator=gen, device=gen.device, dtype=torch.float32)
        param.copy_(draw.mul_(std))


class InitLinear(nn.Linear):
    """``nn.Linear`` with N(0, std) weights from ``gen`` and zero bias, set in its constructor."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, std: float, gen: torch.Generator
    ) -> None:
        super().__init__(in_features, out_features, bias)
        self.reset_from(std, gen)

    def reset_from(self, std: float, gen: torch.Generator) -> None:
        """Draw new weights from ``gen``; zero the bias."""
        _fill_normal(self.weight, std, gen)
        if self.bias is not None:
            with torch.no_grad():
                self.bias.zero_()


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

    def __init__(self, w: WorkloadSpec, gen: torch.Generator) -> None:
        super().__init__()
        self.heads, self.groups = w.num_attention_heads, w.query_groups
        self.head_dim = w.hidden_size // w.num_attention_heads
        self.rope_theta = w.rope_theta if w.position_embedding == "rope" else None
        kv = self.groups * self.head_dim
        q = self.heads * self.head_dim
        self.qkv = InitLinear(w.hidden_size, q + 2 * kv, w.add_bias_linear, INIT_STD, gen)
        self.proj = InitLinear(q, w.hidden_size, w.add_bias_linear, _output_std(w), gen)

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

    def __init__(self, w: WorkloadSpec, gen: torch.Generator) -> None:
        super().__init__()
        self.gated = w.activation == "swiglu"
        width = w.ffn_hidden_size * (2 if self.gated else 1)
        self.fc1 = InitLinear(w.hidden_size, width, w.add_bias_linear, INIT_STD, gen)
        self.fc2 = InitLinear(w.ffn_hidden_size, w.hidden_size, w.add_bias_linear,
                              _output_std(w), gen)

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

    def __init__(self, w: WorkloadSpec, gen: torch.Generator) -> None:
        super().__init__()
        from deepspeed.moe.layer import MoE

        assert w.num_experts is not None
        self.moe = MoE(
            hidden_size=w.hidden_size,
            expert=MLP(w, gen),
            num_experts=w.num_experts,
            ep_size=1,
            k=w.moe_top_k,
            drop_tokens=False,
            use_rts=False,
            top2_2nd_expert_sampling=False,
        )
        # DeepSpeed deep-copies one expert: give each its own initial weights.
        for expert in self.moe.deepspeed_moe.experts.deepspeed_experts[1:]:
            expert.fc1.reset_from(INIT_STD, gen)
            expert.fc2.reset_from(_output_std(w), gen)
        _fill_normal(self.moe.deepspeed_moe.gate.wg.weight, INIT_STD, gen)
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
        gen = layer_generator(init_seed)
        self.attn_norm = _norm(w)
        self.attn = Attention(w, gen)
        self.mlp_norm = _norm(w)
        self.mlp = MoEMLP(w, gen) if w.is_moe else MLP(w, gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, hidden] -> [batch, seq, hidden]."""
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def is_block(layer: nn.Module) -> bool:
    """Whether ``layer`` is a transformer block, as built or wrapped by ``torch.compile``."""
    return isinstance(getattr(layer, "_orig_mod", layer), Block)


class WordEmbedding(nn.Module):
    """Token embedding; with tied embeddings the same module also produces the logits.

    Both uses go through ``forward`` (token ids in: embeddings out; hidden states in: logits
    out), so ZeRO-3 gathers the shared weight by its usual module hooks each time.
    """

    def __init__(self, w: WorkloadSpec, vocab_size: int, init_seed: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, w.hidden_size))
        _fill_normal(self.weight, INIT_STD, layer_generator(init_seed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq] token ids -> [batch, seq, hidden]; [batch, seq, hidden] -> logits."""
        if x.is_floating_point():
            return F.linear(x, self.weight)
        return F.embedding(x, self.weight)


class PositionEmbedding(nn.Module):
    """Learned absolute positions added to the token embeddings (GPT-3)."""

    def __init__(self, w: WorkloadSpec, init_seed: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(w.seq_length, w.hidden_size))
        _fill_normal(self.weight, INIT_STD, layer_generator(init_seed))

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
        self.weight = nn.Parameter(torch.empty(vocab_size, w.hidden_size))
        _fill_normal(self.weight, INIT_STD, layer_generator(init_seed))

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
        out.append(LayerRecipe(WordEmbedding, word, tie))
    else:
        out.append(LayerRecipe(
            OutputLayer,
            dict(w=w, vocab_size=vocab_size, init_seed=layer_seed(seed, 2 + w.num_layers)),
        ))
    return out


class CausalLM(nn.Module):
    """All layers of a workload in one process; returns the loss to train on.

    Args:
        w: The architecture.
        vocab_size: Padded vocabulary size.
        seed: Run seed (each layer's init seed derives from it).
        recompute: Recompute each transformer layer's activations in backward (full
            recomputation, one layer per checkpoint; a layer ``torch.compile`` wrapped counts).
        loss_fn: Mean next-token loss of (logits, labels).
    """

    def __init__(
        self, w: WorkloadSpec, vocab_size: int, seed: int, recompute: bool,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        super().__init__()
        self.recompute, self.loss_fn = recompute, loss_fn
        tied: dict[str, nn.Module] = {}
        self.layers = nn.ModuleList()
        for recipe in layer_recipes(w, vocab_size, seed):
            if recipe.tie_key is not None and recipe.tie_key in tied:
                module = tied[recipe.tie_key]
            else:
                module = recipe.cls(**recipe.kwargs)
                if recipe.tie_key is not None:
                    tied[recipe.tie_key] = module
            self.layers.append(module)

    def forward(
        self, tokens: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Language-model loss, and the MoE router loss (None for a dense model)."""
        x = tokens
        for layer in self.layers:
            if self.recompute and is_block(layer):
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        aux = [m.aux_loss for m in self.modules() if isinstance(m, MoEMLP)]
        return self.loss_fn(x, labels), (torch.stack(aux).sum() if aux else None)


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
                r.tie_key, r.cls, **r.kwargs, tied_weight_attr=["weight"]
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
