"""Shared helpers: run the real CLI in a subprocess, the way users and scripts do."""

import os
import subprocess
import sys
from pathlib import Path

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
