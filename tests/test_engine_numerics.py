"""The kit's megatron attention and layers against plain fp32 references, and real learning."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kit.spec.resolve import RunRequest, resolve

from .conftest import bundle_path

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_attention_and_layers_match_plain_references():
    # MHA + GELU + LayerNorm (gpt3-tiny) and GQA + SwiGLU + RMSNorm (llama-style), fp32 on CPU
    r = subprocess.run([sys.executable, "-m", "tests.layer_numerics", _free_port()], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [row["check"] for row in rows] == [
        "gpt3-tiny attention", "gpt3-tiny layer", "llama-tiny attention", "llama-tiny layer"]
    for row in rows:
        assert row["rel_err"] < 1e-5, row


def test_a_tiny_model_learns(cli, tmp_path):
    r = cli("run", "gpt3-tiny", "--steps", "20", "--warmup", "1", "--telemetry-interval-ms", "0",
            "--out", str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    bundle = bundle_path(r.stdout)
    losses = [row["loss"] for row in pq.read_table(bundle / "steps.parquet").to_pylist()]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    # the synthetic progressions are learnable: 6.92 -> 6.67 on average in the reference run
    assert last < first - 0.15, losses


def test_speed_features_are_gpu_only_and_checked(monkeypatch):
    from kit.engines.megatron import speed

    cpu = resolve(RunRequest(workload="gpt3-tiny", platform="cpu"))
    h100 = resolve(RunRequest(workload="gpt3-1.3b", platform="h100"))
    assert speed.enabled(cpu) == frozenset()
    assert speed.enabled(h100) == speed.DEFAULT and "compile" not in speed.DEFAULT
    mi250 = resolve(RunRequest(workload="gpt3-1.3b", platform="mi250"))
    assert speed.enabled(mi250) == speed.DEFAULT - {"wgrad_fusion"}
    assert speed.config_kwargs(h100, speed.DEFAULT)["gradient_accumulation_fusion"] is True
    fsdp = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", fsdp=True))
    assert speed.enabled(fsdp) == speed.DEFAULT - {"wgrad_fusion"}
    assert "gradient_accumulation_fusion" not in speed.config_kwargs(fsdp, speed.enabled(fsdp))
    monkeypatch.setenv("CHARLLM_SPEED", "wgrad_fusion,fused_adam")
    assert speed.enabled(fsdp) == {"fused_adam"}  # megatron-core's FSDP refuses it without TE
    monkeypatch.setenv("CHARLLM_SPEED", "none")
    assert speed.enabled(h100) == frozenset()
    monkeypatch.setenv("CHARLLM_SPEED", "fusions,warp")
    with pytest.raises(ValueError, match="warp"):
        speed.enabled(h100)
