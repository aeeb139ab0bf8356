"""Bundles of several layouts, for the report tests: real CPU runs with a real GPU trace.

Each run trains gpt3-tiny for a few steps over gloo while the sampler replays the recorded
H100 trace (tests/data/traces) as the node's GPU telemetry, on a platform that adds a 2 x 2
chassis, so every figure of the report has data. One run fails at build time after its
sampler started (a RoPE head dimension megatron-core refuses): a failed run with telemetry and
no step, as a crash investigation sees it. Session-scoped: made once, one after another (side
by side they fight over the two cores).
"""

from pathlib import Path

import pytest

from .conftest import REPO, kit_cli, why_failed

ODD_ROPE = (  # megatron-core rejects it at build time (RoPE needs an even head dim): a failed run
    "family: llama3\nnum_layers: 2\nhidden_size: 66\nnum_attention_heads: 2\n"
    "ffn_hidden_size: 128\nseq_length: 16\nvocab_size: 256\nactivation: swiglu\n"
    "normalization: rmsnorm\nposition_embedding: rope\nadd_bias_linear: false\n"
    "tie_embeddings: false\nglobal_batch_size: 2\n"
)
CHASSIS = "chassis:\n" + "".join(f"  - {{device: {d}, slot: S{d}, row: {d // 2}, col: {d % 2}}}\n"
                                 for d in range(4))
SHORT = ("--steps", "3", "--warmup", "1")


def replay_platform(folder: Path) -> Path:
    """The cpu platform replaying the recorded H100 trace, with a 2 x 2 chassis."""
    path = folder / "cpu-replay-chassis.yaml"
    path.write_text((REPO / "tests/data/platforms/cpu-replay-h100.yaml").read_text() + CHASSIS)
    return path


@pytest.fixture(scope="session", name="layouts")
def layouts_fixture(tmp_path_factory) -> dict[str, Path]:
    """``tp2`` and ``pp2`` (megatron, profiled), ``zero1`` (DeepSpeed ZeRO-1, DP 2) and
    ``failed``: bundle paths by name."""
    out = tmp_path_factory.mktemp("layouts")
    platform = str(replay_platform(out))
    (out / "odd-rope.yaml").write_text(ODD_ROPE)
    argv = {
        "tp2": ["gpt3-tiny", "--tp", "2", *SHORT, "--profile"],
        "pp2": ["gpt3-tiny", "--pp", "2", *SHORT, "--profile"],
        "zero1": ["gpt3-tiny", "--engine", "deepspeed", "--zero", "1", "--dp", "2", *SHORT],
        "failed": [str(out / "odd-rope.yaml"), "--steps", "2", "--warmup", "0"],
    }
    bundles = {}
    for name, args in argv.items():
        r = kit_cli("run", *args, "--platform", platform, "--out", str(out / name))
        assert r.returncode == (1 if name == "failed" else 0), why_failed(r)
        bundles[name] = Path(r.stdout.strip().splitlines()[-1])
    return bundles
