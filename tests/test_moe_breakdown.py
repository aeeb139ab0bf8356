"""The MoE breakdown of a profiled step (kit.analysis.moe_breakdown) on a real CPU trace."""

import pytest

from kit.analysis.moe_breakdown import format_breakdown, step_breakdowns

from .conftest import bundle_path, why_failed


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
