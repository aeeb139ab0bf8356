"""A CPU run's ranks are forked from one process that imported for all (kit.launch.rank_fork):
they are the launcher's own children, each with its rank's log and result, and a death or a
signal while that process imports still ends the run with a bundle and no process left.

The zygote is held in its imports by a ``sitecustomize`` on PYTHONPATH that acts only in the
process whose command line is the zygote's, so that a signal lands there for certain.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kit.bundle.verify import verify_bundle

from .conftest import REPO, bundle_path, first_on_pythonpath, start_long_run, wait_for_steps

pytestmark = pytest.mark.training  # every test here starts ranks (pyproject.toml: tiers)

HOLD = """\
import os, sys, time
if "kit.launch.rank_fork" in sys.orig_argv:
    open(os.environ["HOLD_PID"], "w").write(str(os.getpid()))
    while not os.path.exists(os.environ["HOLD_GO"]):
        time.sleep(0.05)
"""
"""Holds the zygote before its imports until the file HOLD_GO exists; its pid in HOLD_PID."""


def run_args(out: Path) -> list[str]:
    return [sys.executable, "-m", "kit", "run", "gpt3-tiny", "--dp", "2", "--steps", "2",
            "--warmup", "1", "--out", str(out)]


def held_run(tmp_path: Path, *, broken: str | None = None) -> tuple[subprocess.Popen, int, Path]:
    """A 2-rank run whose zygote is held before it imports; the launcher, the zygote's pid and
    the file that releases it. ``broken``: a ``megatron`` package whose import raises that."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD)
    if broken is not None:
        (hook / "megatron").mkdir()
        (hook / "megatron" / "__init__.py").write_text(f"raise ImportError({broken!r})\n")
    env = dict(os.environ, **first_on_pythonpath(hook), HOLD_PID=str(tmp_path / "zygote.pid"),
               HOLD_GO=str(tmp_path / "go"))
    proc = subprocess.Popen(run_args(tmp_path / "out"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "zygote.pid").is_file() or not (tmp_path / "zygote.pid").read_text():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the zygote never started"
        time.sleep(0.05)
    return proc, int((tmp_path / "zygote.pid").read_text()), tmp_path / "go"


def failed_run(proc: subprocess.Popen, go: Path | None = None) -> dict:
    """Release the zygote (``go``, for a held run) and wait for the run: it exits 1 and
    publishes a bundle that verifies; its manifest, with the bundle's path under ``bundle``."""
    try:
        if go is not None:
            go.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    bundle = bundle_path(out)
    verify_bundle(bundle)
    return {**json.loads((bundle / "manifest.json").read_text()), "bundle": str(bundle)}


def left_over(zygote: int) -> list[int]:
    """Processes still running a copy of the zygote's command line."""
    try:
        cmd = psutil.Process(zygote).cmdline()
    except psutil.Error:
        cmd = None
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and (
                p.info["pid"] == zygote or (cmd and p.info["cmdline"] == cmd)):
            out.append(p.info["pid"])
    return out


@pytest.mark.timeout(300)
def test_ranks_are_the_launchers_children_and_the_imports_are_counted_once(tmp_path):
    """Each rank is a child of the launcher running the worker, rank 0's log begins with what
    the imports printed (once) and rank 1's does not; every start-up phase is positive."""
    proc = start_long_run(tmp_path, "--dp", "2")
    try:
        wait_for_steps(tmp_path, 1, timeout_s=240, rank=1)
        ranks = [c for c in psutil.Process(proc.pid).children()
                 if "kit.launch.worker" in c.cmdline() and "kit.launch.rank_fork" in c.cmdline()]
        record = json.loads(next(tmp_path.glob(".*.partial/launcher.json")).read_text())
        assert sorted(c.pid for c in ranks) == sorted(record["rank_pids"])
        assert len(ranks) == 2
        os.killpg(proc.pid, signal.SIGTERM)
    except BaseException:
        proc.kill()
        raise
    manifest = failed_run(proc)
    bundle = Path(manifest["bundle"])
    logs = bundle / "logs"
    assert "Transformer Engine and Apex are not installed" in (logs / "rank0.log").read_text()
    assert "Transformer Engine and Apex are not installed" not in (logs / "rank1.log").read_text()
    assert "rank 0: step 0" in (logs / "rank0.log").read_text()
    phases = json.loads((bundle / "metrics.json").read_text())["lifecycle"]["phases_s"]
    assert all(phases[p] >= 0 for p in ("launcher", "rank_imports", "engine_imports",
                                         "process_groups", "model_build", "first_step")), phases


@pytest.mark.timeout(300)
def test_sigterm_while_the_ranks_import_is_an_interrupted_bundle_and_no_process_is_left(tmp_path):
    """SIGTERM to the run's group while its zygote imports: interrupted, exit 1, a bundle that
    verifies, and neither the zygote nor a rank left running."""
    proc, zygote, go = held_run(tmp_path)
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    manifest = failed_run(proc, go)
    assert manifest["status"] == "interrupted", manifest
    assert left_over(zygote) == []


@pytest.mark.timeout(300)
def test_a_zygote_killed_while_importing_fails_the_run_naming_rank_0_and_the_signal(tmp_path):
    """SIGKILL of the zygote before it forked: the run ends failed (not hung), the error names
    rank 0 killed by SIGKILL, the bundle verifies, and nothing is left running."""
    proc, zygote, go = held_run(tmp_path)
    os.kill(zygote, signal.SIGKILL)
    manifest = failed_run(proc, go)
    assert manifest["status"] == "failed"
    assert manifest["error"].startswith("rank 0: killed by SIGKILL"), manifest["error"]
    assert left_over(zygote) == []


@pytest.mark.timeout(300)
def test_an_engine_that_fails_to_import_fails_the_run_with_its_error_in_rank_0s_log(tmp_path):
    """megatron-core's import raising in the zygote: failed, exit code 1 of rank 0, the error's
    last log line is the exception, rank 0's log holds the traceback."""
    proc, zygote, go = held_run(tmp_path, broken="megatron broken on purpose")
    manifest = failed_run(proc, go)
    assert manifest["status"] == "failed"
    assert manifest["error"].startswith("rank 0: exit code 1"), manifest["error"]
    assert "megatron broken on purpose" in manifest["error"]
    assert "Traceback" in (Path(manifest["bundle"]) / "logs" / "rank0.log").read_text()
    assert left_over(zygote) == []
