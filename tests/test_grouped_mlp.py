"""MoE numerics: the grouped-GEMM experts against SequentialMLP, the whole MoE layer (router,
load-balancing loss, alltoall dispatch over EP2, experts) against a plain PyTorch loop, and
where the layer spec uses the grouped experts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kit.config.loader import load_workload
from kit.errors import KitInputError
from kit.launch.local import free_port
from kit.plan.resolve import RunRequest, resolve

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_grouped_experts_match_sequential_mlp_forward_and_backward():
    # fp32 on CPU, with megatron's plain and fused weighted SwiGLU, weight gradients as grads
    # and added into main_grad (megatron DDP's wgrad fusion); one expert gets no tokens
    r = subprocess.run([sys.executable, "-m", "tests.grouped_mlp_numerics", str(free_port())],
                       cwd=REPO, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    names = ["output", "input grad", "probs grad", "fc1 weight grad", "fc2 weight grad"]
    tags = ("plain", "fused", "main_grad")
    assert [row["check"] for row in rows] == [f"{tag} {n}" for tag in tags for n in names]
    for row in rows:
        assert row["rel_err"] < 1e-6, row


@pytest.mark.timeout(300)
def test_moe_layer_matches_a_plain_loop_over_experts_under_ep2():
    # two ranks over gloo, experts split between them, tokens crossing in the all-to-all;
    # fp32 on CPU, so the tolerance is far inside bf16's (its epsilon is 7.8e-3)
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "tests.moe_layer_numerics", str(rank), "2",
                               port, "2"], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outs = [p.communicate(timeout=280) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    rows = [json.loads(line) for out, _ in outs for line in out.splitlines()
            if line.startswith("{")]
    names = ["output", "input grad", "router weight grad", "fc1 weight grad", "fc2 weight grad"]
    for rank in (0, 1):
        for tag in ("sequential", "grouped"):
            mine = {r["check"]: r for r in rows if r["rank"] == rank}
            for name in names:
                assert mine[f"{tag} {name}"]["rel_err"] < 1e-5, mine[f"{tag} {name}"]
            # the load-balancing loss is a visible part of the router gradient compared
            assert mine[f"{tag} aux loss share of router grad"]["share"] > 1e-3


@pytest.mark.timeout(60)
def test_grouped_gemm_is_a_speed_feature_for_bias_free_moe_only(tmp_path):
    from kit.engines.megatron import adapter, features
    from kit.engines.megatron import model as kit_model
    from kit.engines.megatron.grouped_mlp import GroupedMLP

    def experts(cfg):  # what the MoE layer of the kit's layer spec builds its experts with
        return adapter._moe_submodules(kit_model.layer_spec(cfg)).experts

    def h100(workload, speed_):  # eight GPUs: a global batch of 16 for micro-batch 2
        return resolve(RunRequest(workload=workload, platform="h100", global_batch_size=16,
                                  speed=speed_))

    moe = h100("mixtral-tiny", "grouped_gemm")
    assert features.use_grouped_gemm(moe, features.enabled(moe)) and experts(moe) is GroupedMLP
    off = h100("mixtral-tiny", "fusions")
    assert not features.use_grouped_gemm(off, features.enabled(off))
    assert experts(off) is not GroupedMLP
    default = h100("mixtral-tiny", None)  # measured to pay on an H100: on by default
    assert features.use_grouped_gemm(default, features.enabled(default))
    mi250 = resolve(RunRequest(workload="mixtral-tiny", platform="mi250", global_batch_size=16))
    assert not features.use_grouped_gemm(mi250, features.enabled(mi250))  # unchecked on ROCm
    cpu = resolve(RunRequest(workload="mixtral-tiny", platform="cpu"))
    assert experts(cpu) is not GroupedMLP  # no speed features on CPU
    dense = h100("gpt3-tiny", "grouped_gemm")
    assert not features.use_grouped_gemm(dense, features.enabled(dense))

    spec = load_workload("mixtral-tiny").model_dump(exclude_none=True)
    spec.update(name="mixtral-tiny-bias", add_bias_linear=True)
    path = tmp_path / "mixtral-tiny-bias.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(KitInputError, match="--speed grouped_gemm: the grouped experts have no"):
        h100(str(path), "grouped_gemm")
