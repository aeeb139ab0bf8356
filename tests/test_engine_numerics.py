"""The kit's megatron attention and layers against plain fp32 references, and real learning."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from kit.errors import KitInputError
from kit.launch.local import free_port
from kit.plan.resolve import RunRequest, resolve

from .conftest import bundle_path, why_failed

REPO = Path(__file__).resolve().parents[1]


def test_attention_and_layers_match_plain_references():
    # MHA + GELU + LayerNorm (gpt3-tiny) and GQA + SwiGLU + RMSNorm (llama-style), fp32 on CPU
    r = subprocess.run([sys.executable, "-m", "tests.layer_numerics", str(free_port())], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, why_failed(r)[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [row["check"] for row in rows] == [
        "gpt3-tiny attention", "gpt3-tiny layer", "gpt3-tiny bias-add qkv",
        "llama-tiny attention", "llama-tiny layer"]
    for row in rows:
        assert row["rel_err"] < 1e-5, row


@pytest.mark.training
def test_a_tiny_model_learns(cli, tmp_path):
    r = cli("run", "gpt3-tiny", "--steps", "20", "--warmup", "1", "--telemetry-interval-ms", "0",
            "--out", str(tmp_path), timeout=300)
    assert r.returncode == 0, why_failed(r)
    bundle = bundle_path(r.stdout)
    losses = [row["loss"] for row in pq.read_table(bundle / "steps.parquet").to_pylist()]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    # the synthetic progressions are learnable: 6.92 -> 6.67 on average in the reference run
    assert last < first - 0.15, losses


def test_speed_features_are_gpu_only_and_checked():
    from kit.engines.megatron import features, speed

    cpu = resolve(RunRequest(workload="gpt3-tiny", platform="cpu"))
    h100 = resolve(RunRequest(workload="gpt3-1.3b", platform="h100"))
    assert features.enabled(cpu) == frozenset()
    assert features.enabled(h100) == features.DEFAULT and "compile" not in features.DEFAULT
    mi250 = resolve(RunRequest(workload="gpt3-1.3b", platform="mi250"))
    assert features.enabled(mi250) == features.DEFAULT - {"wgrad_fusion", "cuda_graph",
                                                          "grouped_gemm"}
    assert speed.config_kwargs(h100, features.DEFAULT)["gradient_accumulation_fusion"] is True
    fsdp = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", fsdp=True))
    assert features.enabled(fsdp) == features.DEFAULT - {"wgrad_fusion"}
    assert "gradient_accumulation_fusion" not in speed.config_kwargs(fsdp, features.enabled(fsdp))
    chosen = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", fsdp=True,
                                speed="wgrad_fusion,fused_adam"))
    assert features.enabled(chosen) == {"fused_adam"}  # megatron-core's FSDP refuses it without TE
    assert features.enabled(resolve(RunRequest(workload="gpt3-1.3b", platform="h100",
                                            speed="none"))) == frozenset()
    with pytest.raises(KitInputError, match="--speed: unknown feature.s. warp for the megatron "
                       "engine; known: fusions"):
        resolve(RunRequest(workload="gpt3-1.3b", platform="h100", speed="fusions,warp"))


def test_deepspeed_speed_features_are_its_own_and_default_on_nvidia_only():
    from kit.engines.deepspeed import speed as ds_speed

    def ds(platform: str, speed: str | None = None, zero: int = 1) -> frozenset[str]:
        return ds_speed.enabled(resolve(RunRequest(workload="gpt3-1.3b", platform=platform,
                                                   engine="deepspeed", zero=zero, speed=speed)))

    assert ds("cpu") == frozenset() and ds("h100") == {"compile", "cross_entropy"}
    assert ds("h100", zero=3) == {"cross_entropy"}  # compiled blocks measured slower there
    assert ds_speed.enabled(resolve(RunRequest(workload="gpt3-1.3b", platform="h100",
                                               engine="deepspeed", pp=2))) == {"cross_entropy"}
    assert ds("h100", "compile", zero=3) == {"compile"}
    assert ds("mi250") == {"cross_entropy"} and ds("h100", "none") == frozenset()
    assert ds("h100", "cross_entropy") == {"cross_entropy"}
    with pytest.raises(KitInputError, match="--speed: unknown feature.s. cuda_graph for the "
                       "deepspeed engine; known: compile, cross_entropy"):
        ds("h100", "cuda_graph")


def test_vocab_parallel_cross_entropy_matches_torch_on_one_and_two_ranks():
    r = subprocess.run([sys.executable, "-m", "tests.cross_entropy_parallel", str(free_port())],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, why_failed(r)[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [row["check"] for row in rows] == ["one rank loss", "one rank grad", "tp2 loss",
                                              "tp2 grad"]
    for row in rows:
        assert row["rel_err"] < 1e-5, row


def test_cuda_graph_only_where_the_step_is_capturable(tmp_path):
    from kit.engines import engine_spec
    from kit.engines.megatron import features

    spec = yaml.safe_load((REPO / "platforms" / "h100.yaml").read_text())
    spec.update(devices_per_node=1, chassis=spec["chassis"][:1])
    one_gpu = tmp_path / "h100x1.yaml"  # the shipped h100 platform with one device per node
    one_gpu.write_text(yaml.safe_dump(spec))
    dense = resolve(RunRequest(workload="gpt3-1.3b", platform=str(one_gpu)))
    assert features.graph_blockers(dense) == [] and features.use_cuda_graph(dense, features.DEFAULT)
    assert not features.use_cuda_graph(dense, features.DEFAULT - {"cuda_graph"})
    sharded = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", tp=2, sp=True,
                                 dist_optimizer=True))
    assert sharded.world_size == 8 and features.use_cuda_graph(sharded, features.DEFAULT)
    # overlapped gradient reduction is captured (its parameter all-gather is not overlapped)
    overlapped = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", dist_optimizer=True,
                                    overlap=True))
    assert features.graph_blockers(overlapped) == []
    # activation recomputation is captured (graph-safe RNG states, dropout 0)
    for recompute in ("full", "selective"):
        recomputed = resolve(RunRequest(workload="gpt3-1.3b", platform=str(one_gpu),
                                        recompute=recompute))
        assert engine_spec("megatron").execution(recomputed).as_json() == {
            "mode": "graphed", "eager_because": []}
    piped = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", pp=2, cp=2,
                               global_batch_size=64, recompute="full"))
    assert features.graph_blockers(piped) == ["pipeline parallelism without graph_pipeline"]
    context = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", cp=2, tp=2, sp=True))
    assert features.graph_blockers(context) == [] and features.use_cuda_graph(context,
                                                                              features.DEFAULT)
    assert not features.use_cuda_graph(piped, features.DEFAULT)
    assert engine_spec("megatron").execution(piped).describe() == (
        "eager (pipeline parallelism without graph_pipeline)")
    # the pipelined step is captured on request (off by default until a 2-GPU run measures it)
    graphed_pipe = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", pp=2, vpp=2,
                                      global_batch_size=64, recompute="full",
                                      speed=",".join(features.DEFAULT | {"graph_pipeline"})))
    assert engine_spec("megatron").execution(graphed_pipe).graphed
    assert "graph_pipeline" not in features.DEFAULT
    moe = resolve(RunRequest(workload="mixtral-tiny", platform=str(one_gpu)))
    assert features.graph_blockers(moe) == ["mixture of experts with dropless routing"]
    mi250 = resolve(RunRequest(workload="gpt3-1.3b", platform="mi250"))
    assert "cuda_graph" not in features.enabled(mi250)
    assert engine_spec("megatron").execution(mi250).eager_because == (
        "cuda_graph not among the speed features",)
    cpu = resolve(RunRequest(workload="gpt3-tiny", platform="cpu"))
    assert engine_spec("megatron").execution(cpu).eager_because == (
        "CPU platform: no CUDA graphs",)
    deepspeed = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", engine="deepspeed"))
    assert engine_spec("deepspeed").execution(deepspeed).describe() == (
        "eager (the deepspeed engine captures no CUDA graph)")


def test_foreach_optimizer_ops_match_plain_arithmetic_and_swap_back():
    import torch
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads

    from kit.engines.megatron import adapter, foreach_ops

    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(shape, generator=gen) for shape in ((7, 5), (3,), (2, 2, 2))]
    norm, _ = foreach_ops.l2_norm(0, None, [grads], False)
    want = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    assert norm.shape == (1,) and torch.allclose(norm[0], want, rtol=1e-6)
    before = [g.clone() for g in grads]
    foreach_ops.scale(0, None, [grads, grads], 0.5)  # clipping: in place
    assert all(torch.equal(g, b * 0.5) for g, b in zip(grads, before, strict=True))
    model = [torch.empty_like(g, dtype=torch.bfloat16) for g in grads]
    foreach_ops.scale(0, None, [grads, model], 1.0)  # main params -> model params
    assert all(torch.equal(m, g.bfloat16()) for m, g in zip(model, grads, strict=True))

    adapter.use_foreach_multi_tensor_ops(True)
    assert clip_grads.l2_norm_impl is foreach_ops.l2_norm
    adapter.use_foreach_multi_tensor_ops(False)
    assert clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_attention_of_every_rank_is_causal_attention(cp):
    """Each CP rank's chunks (r and 2cp-1-r) against the whole sequence reproduce full causal
    attention, output and gradients (key/value gradients summed over ranks), fp32 on CPU."""
    import torch
    import torch.nn.functional as F

    from kit.engines.megatron.context_parallel import local_attention, positions

    gen = torch.Generator().manual_seed(0)
    seq, chunk = 64, 64 // (2 * cp)
    q = torch.randn(2, 8, seq, 16, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, seq, 16, generator=gen, requires_grad=True)
    v = torch.randn(2, 2, seq, 16, generator=gen, requires_grad=True)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    grad = torch.randn(full.shape, generator=gen)
    dq, dk, dv = torch.autograd.grad(full, (q, k, v), grad)
    dk_sum, dv_sum = torch.zeros_like(k), torch.zeros_like(v)
    for rank in range(cp):
        mine = positions(rank, cp, chunk)
        q_r = q.detach()[:, :, mine].requires_grad_()
        k_r, v_r = k.detach().requires_grad_(), v.detach().requires_grad_()
        out = local_attention(q_r, k_r, v_r, rank, cp, enable_gqa=True)
        g_q, g_k, g_v = torch.autograd.grad(out, (q_r, k_r, v_r), grad[:, :, mine])
        torch.testing.assert_close(out, full[:, :, mine], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g_q, dq[:, :, mine], rtol=1e-5, atol=1e-6)
        dk_sum += g_k
        dv_sum += g_v
    torch.testing.assert_close(dk_sum, dk, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dv_sum, dv, rtol=1e-5, atol=1e-5)
