"""Model FLOPs (Megatron-LM's formula), vocabulary padding and parameter counts.

Expected FLOPs are worked out by hand below, term by term, from the formula in
``kit/metrics/flops.py``: F = 6 B s (L [h(q + 2kv) + q s + q h + e h f k] + h V_padded).
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kit.config.loader import load_workload
from kit.config.workload import padded_vocab_size
from kit.metrics.flops import model_flops_per_step, params_count

REPO = Path(__file__).resolve().parent.parent


def test_padded_vocab_size_rounds_up_to_128_times_tp() -> None:
    assert padded_vocab_size(50257) == 50304  # 393 x 128
    assert padded_vocab_size(50257, tp=8) == 51200  # 50 x 1024
    assert padded_vocab_size(128256) == 128256  # already 1002 x 128
    assert padded_vocab_size(128256, tp=8) == 129024  # 126 x 1024
    assert padded_vocab_size(32000, tp=8) == 32768  # 32 x 1024
    assert padded_vocab_size(1024, tp=2, divisible_by=64) == 1024
    with pytest.raises(ValueError):
        padded_vocab_size(0)


def test_gpt3_175b_flops_by_hand() -> None:
    # h=12288 s=2048 L=96 n=g=96 -> d=128, q=kv=12288; f=49152, GELU: e=2, dense: k=1;
    # vocab 50257 padded to 50304 (tp=1).
    qkv = 12288 * (12288 + 2 * 12288)  # 452,984,832
    scores = 12288 * 2048  # 25,165,824  (q s: two GEMMs over half the s x s matrix)
    out_proj = 12288 * 12288  # 150,994,944
    mlp = 2 * 12288 * 49152 * 1  # 1,207,959,552
    per_layer = qkv + scores + out_proj + mlp
    assert per_layer == 1_837_105_152
    logits = 12288 * 50304  # 618,135,552
    per_token = 96 * per_layer + logits
    assert per_token == 176_980_230_144
    expected = 6 * 128 * 2048 * per_token
    assert expected == 278_365_832_705_212_416  # ~2.78e17 FLOPs per 128-sample step
    assert model_flops_per_step(load_workload("gpt3-175b"), 128) == float(expected)

    # tp=8 pads the vocabulary to 51200: only the logits term changes.
    expected_tp8 = 6 * 128 * 2048 * (96 * per_layer + 12288 * 51200)
    assert model_flops_per_step(load_workload("gpt3-175b"), 128, tp=8) == float(expected_tp8)


def test_llama3_70b_flops_by_hand() -> None:
    # h=8192 s=8192 L=80 n=64 g=8 -> d=128, q=8192, kv=1024; f=28672, SwiGLU: e=3, k=1;
    # vocab 128256 is already a multiple of 128.
    qkv = 8192 * (8192 + 2 * 1024)  # 83,886,080
    scores = 8192 * 8192  # 67,108,864
    out_proj = 8192 * 8192  # 67,108,864
    mlp = 3 * 8192 * 28672 * 1  # 704,643,072
    per_layer = qkv + scores + out_proj + mlp
    assert per_layer == 922_746_880
    logits = 8192 * 128256  # 1,050,673,152
    per_token = 80 * per_layer + logits
    assert per_token == 74_870_423_552
    expected = 6 * 128 * 8192 * per_token
    assert expected == 471_043_975_478_771_712  # ~4.71e17
    assert model_flops_per_step(load_workload("llama3-70b"), 128) == float(expected)


@pytest.mark.timeout(30)
def test_llama3_8b_8l_flops_and_params_by_hand() -> None:
    # h=4096 s=8192 L=8 n=32 g=8 -> d=128, q=4096, kv=1024; f=14336, SwiGLU: e=3, k=1;
    # vocab 128256 is already a multiple of 128. One sequence per step.
    qkv = 4096 * (4096 + 2 * 1024)  # 25,165,824
    scores = 4096 * 8192  # 33,554,432
    out_proj = 4096 * 4096  # 16,777,216
    mlp = 3 * 4096 * 14336 * 1  # 176,160,768
    per_layer = qkv + scores + out_proj + mlp
    assert per_layer == 251_658_240
    logits = 4096 * 128256  # 525,336,576
    per_token = 8 * per_layer + logits
    assert per_token == 2_538_602_496
    expected = 6 * 1 * 8192 * per_token
    assert expected == 124_777_389_883_392  # ~1.25e14
    assert model_flops_per_step(load_workload("llama3-8b-8l"), 1) == float(expected)
    # parameters: per layer QKV, output projection, SwiGLU MLP, two RMSNorm weights; embedding,
    # untied output layer, final RMSNorm
    layer = 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    assert params_count(load_workload("llama3-8b-8l")) == 8 * layer + 2 * 4096 * 128256 + 4096


def test_mixtral_tiny_moe_flops_by_hand() -> None:
    # h=128 s=128 L=2 n=8 g=4 -> d=16, q=128, kv=64; f=256 per expert, SwiGLU e=3, top-2: k=2;
    # vocab 1024 (already padded). The router (h x 4 experts) is not counted, as in Megatron.
    qkv = 128 * (128 + 2 * 64)  # 32,768
    scores = 128 * 128  # 16,384
    out_proj = 128 * 128  # 16,384
    mlp = 3 * 128 * 256 * 2  # 196,608
    per_layer = qkv + scores + out_proj + mlp
    assert per_layer == 262_144
    per_token = 2 * per_layer + 128 * 1024  # 524,288 + 131,072 = 655,360
    expected = 6 * 8 * 128 * per_token
    assert expected == 4_026_531_840
    assert model_flops_per_step(load_workload("mixtral-tiny"), 8) == float(expected)


def test_flops_match_megatrons_older_closed_form_plus_causal_halving() -> None:
    # Megatron-LM's 2024 closed form (no causal halving):
    # 12 B s L h^2 [(1 + g/n + s/h) q/h + k f/h (3/2 if gated) + V / (2 L h)].
    # The current form counts the attention-score GEMMs over half the matrix: 6 B s L q s less.
    w = load_workload("llama3-70b")
    b, s, layers, h, n, g, f, v = 128, 8192, 80, 8192, 64, 8, 28672, 128256
    q = h  # kv_channels x heads
    old = 12 * b * s * layers * h * h * (
        (1 + g / n + s / h) * (q / h) + (f / h) * 1 * 1.5 + v / (2 * layers * h)
    )
    current = old - 6 * b * s * layers * q * s
    assert model_flops_per_step(w, b) == pytest.approx(current, rel=1e-12)


def test_gpt3_175b_flops_per_token_close_to_six_times_params() -> None:
    w = load_workload("gpt3-175b")
    per_token = model_flops_per_step(w, 1) / w.seq_length
    ratio = per_token / (6 * params_count(w))
    assert 0.85 < ratio < 1.15, ratio


def test_flops_scale_linearly_with_batch() -> None:
    w = load_workload("gpt3-tiny")
    assert model_flops_per_step(w, 16) == 2 * model_flops_per_step(w, 8)
    with pytest.raises(ValueError):
        model_flops_per_step(w, 0)


def test_params_count_matches_published_totals() -> None:
    # GPT-3 175B by hand: per layer 12 h^2 + 13 h (QKV, out proj, 4h MLP, biases, 2 LayerNorms);
    # plus word (50257 h) and position (2048 h) embeddings, tied output, final LayerNorm (2h).
    h = 12288
    gpt3 = 96 * (12 * h * h + 13 * h) + 50257 * h + 2048 * h + 2 * h
    assert params_count(load_workload("gpt3-175b")) == gpt3 == 174_604_259_328
    # Totals of the released checkpoints (Hugging Face safetensors metadata).
    assert params_count(load_workload("llama3-8b")) == 8_030_261_248
    assert params_count(load_workload("llama3-70b")) == 70_553_706_496
    assert params_count(load_workload("mixtral-8x7b")) == 46_702_792_704


_MEGATRON_PARAMS = textwrap.dedent(
    """
    import sys
    import torch.distributed as dist
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig
    from kit.metrics.flops import params_count
    from kit.engines.megatron import adapter
    from kit.config.loader import load_workload

    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    for name in ("gpt3-tiny", "mixtral-tiny"):
        w = load_workload(name)
        swiglu = w.activation == "swiglu"
        config = TransformerConfig(
            num_layers=w.num_layers, hidden_size=w.hidden_size,
            num_attention_heads=w.num_attention_heads, num_query_groups=w.query_groups,
            ffn_hidden_size=w.ffn_hidden_size, gated_linear_unit=swiglu,
            activation_func=F.silu if swiglu else F.gelu,
            normalization="RMSNorm" if w.normalization == "rmsnorm" else "LayerNorm",
            add_bias_linear=w.add_bias_linear, use_cpu_initialization=True,
            num_moe_experts=w.num_experts, moe_router_topk=w.moe_top_k,
        )
        spec = adapter.local_layer_spec(w.num_experts, rms_norm=w.normalization == "rmsnorm")
        model = GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=w.vocab_size,
            max_sequence_length=w.seq_length,
            share_embeddings_and_output_weights=w.tie_embeddings,
            position_embedding_type=w.position_embedding,
        )
        print(name, sum(p.numel() for p in model.parameters()), params_count(w))
    """
)


def test_params_count_equals_megatron_core_model(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", _MEGATRON_PARAMS, str(tmp_path / "pg")],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()]
    assert [r[0] for r in rows] == ["gpt3-tiny", "mixtral-tiny"]
    for name, real, counted in rows:
        assert int(real) == int(counted), name
