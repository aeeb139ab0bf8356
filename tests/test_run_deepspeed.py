"""Real DeepSpeed runs on the CPU over gloo, through the CLI: ZeRO 0-3, offload, pipeline, MoE.

Every layout trains the same model (each layer is initialized from its own seed, whichever
process builds it) on the same synthetic batches per data-parallel rank, so equivalent layouts
must report the same loss per step and rank within fp32 tolerance. The DeepSpeed engine's
model is not initialized like megatron-core's, so no parity with the megatron engine is claimed.
"""

import json
import math
from pathlib import Path

import pytest

from kit.bundle.reader import read_bundle
from kit.bundle.verify import verify_bundle

from .conftest import bundle_path, kit_cli, losses_by_rank, why_failed

pytestmark = pytest.mark.training  # every test here starts ranks (pyproject.toml: tiers)

STEPS = ("--steps", "2", "--warmup", "1")
FP32_REL = 1e-5
PIPE_REL = 1e-4
"""Under PP the tied embedding's two gradient halves are summed by an all-reduce between the
stages instead of by autograd in one buffer; Adam's normalized update turns that last-bit
difference in near-zero gradients into ~1e-5 relative loss differences after a few steps."""


def deepspeed_run(out: Path, *args: str) -> Path:
    """Run gpt3-tiny (unless a workload is given first) with --engine deepspeed; its bundle."""
    workload = args[0] if args and not args[0].startswith("-") else "gpt3-tiny"
    rest = args[1:] if args and not args[0].startswith("-") else args
    r = kit_cli("run", workload, "--engine", "deepspeed", *rest, *STEPS, "--out", str(out))
    assert r.returncode == 0, why_failed(r)[-3000:]
    bundle = bundle_path(r.stdout)
    verify_bundle(bundle)
    return bundle


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One bundle per layout, shared by the assertions below."""
    layouts = {
        "zero0": ("--zero", "0", "--dp", "2"),
        "zero1": ("--zero", "1", "--dp", "2"),
        "zero2_offload": ("--zero", "2", "--offload", "--dp", "2"),
        "zero3": ("--zero", "3", "--dp", "2"),
        "pp2_dp2": ("--pp", "2", "--dp", "2", "--zero", "1"),
    }
    return {name: deepspeed_run(tmp_path_factory.mktemp(name), *args)
            for name, args in layouts.items()}


def test_zero_stages_write_complete_bundles(runs):
    for name in ("zero1", "zero2_offload", "zero3"):
        b = read_bundle(runs[name])
        assert b.manifest.status == "ok", name
        assert b.manifest.config["engine"] == "deepspeed"
        assert b.manifest.inventory[0].engine_versions["deepspeed"].startswith("0.")
        assert [r.dp_rank for r in b.manifest.ranks] == [0, 1]
        assert b.metrics.summary["world_size"] == 2
        assert b.metrics.summary["step_time_s"] > 0
    notes = read_bundle(runs["zero2_offload"]).metrics.notes
    assert any("ZeRO stage 2, optimizer offloaded to the host" in n for n in notes)


def test_zero_stages_match_plain_data_parallel(runs):
    """ZeRO shards states, gradients and parameters, not the math: losses match ZeRO-0."""
    base = losses_by_rank(runs["zero0"])
    assert base[0] != base[1]  # the two data-parallel ranks see different batches
    assert all(math.isfinite(x) for x in base[0] + base[1]) and len(base[0]) == 3
    for name in ("zero1", "zero2_offload", "zero3"):
        got = losses_by_rank(runs[name])
        for rank in (0, 1):
            assert got[rank] == pytest.approx(base[rank], rel=FP32_REL), (name, rank)


def test_pipeline_engine_matches_unsplit_model(runs):
    """PP2 x DP2: stage of every rank recorded, loss on the last stage equal to ZeRO-0 DP2."""
    bundle = runs["pp2_dp2"]
    m = json.loads((bundle / "manifest.json").read_text())
    assert [(r["pp_rank"], r["dp_rank"]) for r in m["ranks"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["stage"] for r in m["ranks"]] == [0, 0, 1, 1]
    losses = losses_by_rank(bundle)
    assert losses[0] == [None] * 3 and losses[1] == [None] * 3  # first stage computes no loss
    base = losses_by_rank(runs["zero0"])
    for pipe_rank, dp_rank in ((2, 0), (3, 1)):
        # same weights and batches: the first step's loss is the same forward pass
        assert losses[pipe_rank][0] == pytest.approx(base[dp_rank][0], rel=1e-6)
        assert losses[pipe_rank] == pytest.approx(base[dp_rank], rel=PIPE_REL)


def test_mixtral_moe_trains_with_deepspeed_moe_layer(tmp_path):
    bundle = deepspeed_run(tmp_path, "mixtral-tiny", "--zero", "2", "--dp", "2")
    losses = losses_by_rank(bundle)
    assert losses[0] != losses[1] and all(math.isfinite(x) for x in losses[0] + losses[1])


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--pp", "2", "--zero", "3"], "DeepSpeed's pipeline engine supports ZeRO stage 0 or 1"),
        (["--offload"], "--offload moves ZeRO's optimizer states to the host"),
        (["--dist-optimizer"], "with --engine deepspeed use --zero 1"),
    ],
)
def test_refused_deepspeed_combinations_are_one_line(cli, args, needle):
    r = cli("run", "gpt3-tiny", "--engine", "deepspeed", *args, "--dry-run", timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
