"""Every benchmark script still imports, and every benchmark shell script still parses.

The scripts under ``benchmarks/`` run on GPU machines, by hand, long after they were written;
most import kit internals no other test imports. Importing each one here (its ``main`` does not
run: every script keeps its work behind ``if __name__ == "__main__"``) fails the suite when a
module or name it uses moves, instead of the next GPU session finding out.
"""
# ruff: noqa: D103  (test names say what they check)

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPTS = sorted(p for p in (REPO / "benchmarks").rglob("*.py") if p.name != "__init__.py")
SHELL = sorted((REPO / "benchmarks").rglob("*.sh"))


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) >= 30 and len(SHELL) >= 30


@pytest.fixture
def isolated_imports():
    """Leave ``sys.path`` and the benchmarks' own modules as they were: scripts put their
    folder on the path and import siblings by bare name (``points``, ``summarize``)."""
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    bench = str(REPO / "benchmarks")
    for name in set(sys.modules) - modules:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(bench):
            del sys.modules[name]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO / "benchmarks")))
def test_benchmark_script_imports(script: Path, isolated_imports):
    sys.path.insert(0, str(script.parent))  # as `python SCRIPT` does: siblings import by name
    name = "benchmark_" + "_".join(script.relative_to(REPO / "benchmarks").with_suffix("").parts)
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


@pytest.mark.parametrize("script", SHELL, ids=lambda p: str(p.relative_to(REPO / "benchmarks")))
def test_benchmark_shell_script_parses(script: Path):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
