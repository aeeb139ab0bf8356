"""Workload specs: a model architecture and its default batch sizes, as declared in YAML."""

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from kit.config.bounds import MAX_BATCH, MAX_LAYERS, MAX_WIDTH
from kit.neutralize import refuse_control

PlainText = Annotated[str, AfterValidator(refuse_control)]
"""A name or value that lands in comments, job names and scripts: no line breaks or escapes."""


class WorkloadSpec(BaseModel):
    """One model family member, e.g. ``gpt3-175b`` or ``mixtral-8x7b``.

    Architectures follow their publications (GPT-3 paper table 2.1, Llama 3 and Mixtral
    model cards). Every field maps to one megatron-core ``TransformerConfig`` / ``GPTModel``
    argument, so the same spec drives every engine.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: PlainText = Field(description="Unique name, equal to the YAML file's stem.")
    family: Literal["gpt3", "llama3", "mixtral"] = Field(description="Model family.")
    description: str = Field("", description="One line for `workloads list`.")
    num_layers: int = Field(gt=0, le=MAX_LAYERS, description="Transformer layers.")
    hidden_size: int = Field(gt=0, le=MAX_WIDTH, description="Model width.")
    num_attention_heads: int = Field(gt=0, le=MAX_WIDTH, description="Query heads.")
    num_query_groups: int | None = Field(
        None, gt=0, le=MAX_WIDTH,
        description="Key/value heads (grouped-query attention); null = one per head."
    )
    ffn_hidden_size: int = Field(gt=0, le=MAX_WIDTH,
                                 description="MLP inner width (per expert for MoE).")
    seq_length: int = Field(gt=0, le=MAX_WIDTH, description="Tokens per sample.")
    vocab_size: int = Field(gt=0, le=MAX_WIDTH, description="Vocabulary size (before padding).")
    activation: Literal["gelu", "swiglu"] = Field(description="MLP activation; swiglu is gated.")
    normalization: Literal["layernorm", "rmsnorm"] = Field(description="Norm layer type.")
    position_embedding: Literal["learned_absolute", "rope"] = Field(
        description="Position encoding."
    )
    rope_theta: float = Field(10000.0, gt=0, le=1e12,
                              description="RoPE base; ignored without rope.")
    add_bias_linear: bool = Field(True, description="Bias in linear layers (GPT-3 yes, Llama no).")
    tie_embeddings: bool = Field(True, description="Share input embedding and output weights.")
    num_experts: int | None = Field(None, gt=1, le=MAX_WIDTH,
                                    description="MoE experts per layer; null = dense.")
    moe_top_k: int = Field(2, gt=0, le=MAX_WIDTH,
                           description="Experts each token is routed to (MoE only).")
    moe_capacity_factor: float | None = Field(
        None, gt=0, le=64, description="Expert capacity as a multiple of an even share of the "
        "routed tokens (megatron-core's moe_expert_capacity_factor); tokens routed beyond it "
        "are dropped. null = dropless: every routed token is computed, so the experts' shapes "
        "change every step (MoE only).")
    moe_pad_to_capacity: bool = Field(
        False, description="Pad every expert's input to its capacity (needs "
        "moe_capacity_factor): the step's shapes no longer depend on the routing, so it can "
        "be one CUDA graph. The reference study trained Mixtral at capacity 1.0, padded.")
    micro_batch_size: int = Field(1, gt=0, le=MAX_BATCH,
                                  description="Default samples per micro-batch per rank.")
    global_batch_size: int = Field(gt=0, le=MAX_BATCH,
                                   description="Default samples per optimizer step.")

    @property
    def query_groups(self) -> int:
        """Key/value heads actually used (``num_attention_heads`` when not grouped)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        """Whether the MLP is a mixture of experts."""
        return self.num_experts is not None

    @model_validator(mode="after")
    def _check_shape(self) -> "WorkloadSpec":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.query_groups:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not divisible by "
                f"num_query_groups {self.query_groups}"
            )
        if self.num_experts is not None and self.moe_top_k > self.num_experts:
            raise ValueError(f"moe_top_k {self.moe_top_k} exceeds num_experts {self.num_experts}")
        if self.moe_pad_to_capacity and self.moe_capacity_factor is None:
            raise ValueError("moe_pad_to_capacity needs moe_capacity_factor (a dropless MoE has "
                             "no capacity to pad to)")
        return self

    @property
    def moe_padded(self) -> bool:
        """Whether every expert's input is padded to a fixed capacity (static MoE shapes)."""
        return self.is_moe and self.moe_pad_to_capacity


class ScalingRule(BaseModel):
    """How a platform scales a workload that does not fit it, keeping the rest intact.

    The default rule keeps width, heads and sequence length (so per-layer kernels match the
    original) and cuts depth; ``set`` may override any architecture field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str = Field(description="Why the original does not run here, e.g. memory per device.")
    set: dict[str, Annotated[int, Field(gt=0, le=MAX_WIDTH)]] = Field(
        description="Architecture fields to override, e.g. num_layers.")


class ScalingRecord(BaseModel):
    """Provenance of a scaled variant: the original, the rule and the result's changed fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    original: WorkloadSpec
    rule: ScalingRule
    platform: str = Field(description="Platform whose profile declared the rule.")


def padded_vocab_size(vocab_size: int, tp: int = 1, divisible_by: int = 128) -> int:
    """Vocabulary size as Megatron pads it for the embedding and output layers.

    Megatron-LM (``_vocab_size_with_padding`` in ``megatron/training/tokenizer/tokenizer.py``)
    rounds the vocabulary up to a multiple of ``make_vocab_size_divisible_by`` (default 128)
    times the tensor-parallel size, so every TP rank holds an equal, aligned slice.

    Args:
        vocab_size: Tokenizer vocabulary size before padding.
        tp: Tensor-parallel degree.
        divisible_by: Megatron's ``--make-vocab-size-divisible-by``.

    Returns:
        The smallest multiple of ``divisible_by * tp`` that is at least ``vocab_size``.
    """
    if vocab_size <= 0 or tp <= 0 or divisible_by <= 0:
        raise ValueError("vocab_size, tp and divisible_by must be positive")
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple
