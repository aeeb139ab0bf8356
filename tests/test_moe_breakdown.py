"""The MoE breakdown of a profiled step (kit.metrics.moe_breakdown) on a real CPU trace."""

import json

import pytest

from kit.metrics.moe_breakdown import format_breakdown, step_breakdowns

from .conftest import bundle_path, why_failed


@pytest.mark.training
@pytest.mark.timeout(600)
def test_a_profiled_moe_step_splits_into_its_stages(cli, tmp_path):
    r = cli("run", "mixtral-tiny", "--profile", "--steps", "1", "--warmup", "0",
            "--out", str(tmp_path))
    assert r.returncode == 0, why_failed(r)
    steps = step_breakdowns(bundle_path(r.stdout) / "profile" / "rank0.json")
    assert [s["step"] for s in steps] == [0]
    cats = steps[0]["categories"]
    assert sum(cats.values()) == pytest.approx(steps[0]["window_s"], rel=1e-9)
    for stage in ("expert GEMMs", "expert other", "router", "permute/unpermute", "MatMul",
                  "optimizer"):
        assert cats.get(stage, 0) > 0, (stage, cats)
    calls = steps[0]["calls"]
    # forward: 2 layers x 4 micro-batches x 4 experts x 2 linears, each an aten::matmul over an
    # aten::mm; their backward (input and weight gradients) is given to the experts too
    assert calls["expert GEMMs"] > 2 * (2 * 4 * 4 * 2 * 2)
    text = format_breakdown(steps[0])
    assert "expert GEMMs" in text and "permute/unpermute" in text


def test_device_kernels_follow_their_launch_and_backward_its_forward_stage(tmp_path):
    # the shape of a CUDA Kineto trace: host ranges and operators on the main thread (1) and
    # the autograd thread (2), launches tied to kernels on stream 7 by their correlation id
    def op(name, ts, dur, tid, cat="cpu_op", **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1,
                "tid": tid, "args": args}

    def kernel(name, ts, dur, corr):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0,
                "tid": 7, "args": {"correlation": corr}}

    def launch(ts, corr, tid=1, cat="cuda_runtime"):
        return op("cudaLaunchKernel", ts, 2, tid, cat=cat, correlation=corr)

    events = [
        op("ProfilerStep#5", 0, 1000, 1, cat="user_annotation"),
        op("moe:router", 10, 100, 1, cat="user_annotation"),
        op("aten::mm", 20, 50, 1, **{"Sequence number": 7}), launch(30, 1),
        op("moe:experts", 200, 100, 1, cat="user_annotation"),
        op("aten::_grouped_mm", 210, 50, 1, **{"Sequence number": 8}), launch(220, 2),
        op("autograd::engine::evaluate_function: MmBackward0", 400, 100, 2,
           **{"Sequence number": 7}),
        op("aten::mm", 410, 50, 2), launch(420, 3, tid=2),
        op("autograd::engine::evaluate_function: _GroupedMatmulBackward", 520, 100, 2,
           **{"Sequence number": 8}), launch(530, 4, tid=2),
        op("Optimizer.step#AdamW.step", 700, 100, 1, cat="user_annotation"),
        launch(710, 5, cat="cuda_driver"), launch(840, 6),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 40, 60, 1),
        kernel("cutlass::device_kernel<GemmUniversal<GroupProblemShape>>", 230, 150, 2),
        kernel("nvjet_hsh_64x8_gemm", 430, 50, 3),
        kernel("cutlass::device_kernel<GemmUniversal<GroupProblemShape>>", 540, 100, 4),
        kernel("multi_tensor_apply_kernel", 720, 80, 5),
        kernel("ncclDevKernel_AllToAll_RING_LL", 850, 50, 6),
    ]
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    (step,) = step_breakdowns(trace)
    assert step["step"] == 5 and step["window_s"] == pytest.approx(1e-3)
    want = {"router": 110, "expert GEMMs": 250, "optimizer": 80, "AllToAll": 50, "idle": 510}
    assert step["categories"] == pytest.approx({k: v / 1e6 for k, v in want.items()})
    assert step["calls"] == {"router": 2, "expert GEMMs": 2, "optimizer": 1, "AllToAll": 1}
