"""Shared helpers: run the real CLI in a subprocess, the way users and scripts do."""

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parent.parent


def kit_cli(*args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m kit ARGS`` and capture its output."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "kit", *args], capture_output=True, text=True, timeout=timeout,
        cwd=REPO, env=env, **kw,
    )


@pytest.fixture
def cli():
    """The ``kit_cli`` runner."""
    return kit_cli


def bundle_path(stdout: str) -> Path:
    """The last stdout line of ``run`` is the bundle path."""
    return Path(stdout.strip().splitlines()[-1])


def losses_by_rank(bundle: Path) -> dict[int, list[float]]:
    """Each rank's loss per step, in step order, from a bundle's steps.parquet."""
    rows = pq.read_table(bundle / "steps.parquet").to_pylist()
    out: dict[int, list[float]] = {}
    for r in sorted(rows, key=lambda r: (r["rank"], r["step"])):
        out.setdefault(r["rank"], []).append(r["loss"])
    return out


@pytest.fixture(scope="session")
def gpt3_tiny_reference(tmp_path_factory) -> Path:
    """One-process gpt3-tiny run (5 steps): the reference equivalent layouts must match."""
    out = tmp_path_factory.mktemp("gpt3-tiny-tp1")
    r = kit_cli("run", "gpt3-tiny", "--steps", "4", "--warmup", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    return bundle_path(r.stdout)


@pytest.fixture(scope="session")
def cpu_bundle(tmp_path_factory) -> Path:
    """One real 2-rank (TP 2) gpt3-tiny CPU run's bundle, shared: copy it before changing it."""
    out = tmp_path_factory.mktemp("cpu-run")
    r = kit_cli("run", "gpt3-tiny", "--tp", "2", "--steps", "2", "--warmup", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    return bundle_path(r.stdout)
