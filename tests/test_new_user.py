"""What a new user meets first (issue 59): commands that say what they do and what to do next,
defaults that fit the workload and host, and output that lands outside the checkout."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, why_failed


def kit_in(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m kit ARGS`` run from ``folder`` (the user's working directory)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=folder, env=env)


def test_platforms_gemm_fits_the_workload_says_its_progress_and_writes_under_results(tmp_path):
    shipped = sorted(p.name for p in (REPO / "platforms").iterdir())
    r = kit_in(tmp_path, "platforms", "gemm", "--platform", "cpu", "--workload", "gpt3-tiny",
               "--micro-batch", "1", "--min-time-ms", "1")
    assert r.returncode == 0, why_failed(r)
    table = tmp_path / "results" / "cpu.gemm.json"
    assert r.stdout.strip().splitlines()[-1] == str(table.resolve())
    assert sorted(p.name for p in (REPO / "platforms").iterdir()) == shipped
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("gemm: timing 33 GEMM shapes of gpt3-tiny at TP [1, 2, 4] x "
                               "micro-batch [1]") and ": about " in lines[0], r.stderr
    assert lines[-1].startswith("gemm: 33/33 shapes timed in "), r.stderr
    # the default TP degrees are those gpt3-tiny's 4 heads divide: 1, 2 and 4, not 8
    points = json.loads(table.read_text())["points"]
    qkv_widths = {p["n"] for p in points if p["name"] == "qkv" and p["pass"] == "forward"}
    assert qkv_widths == {3 * 128 // tp for tp in (1, 2, 4)}


def test_platforms_gemm_on_a_cpu_host_refuses_a_big_models_default_shapes(tmp_path):
    r = kit_in(tmp_path, "platforms", "gemm", "--platform", "cpu", "--workload", "gpt3-175b")
    assert r.returncode == 2
    assert r.stderr.startswith("error: timing ") and len(r.stderr.strip().splitlines()) == 1
    assert "on one CPU thread would take about" in r.stderr and "--workload gpt3-tiny" in r.stderr
    assert not (tmp_path / "results").exists()
