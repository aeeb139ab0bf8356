"""The report's worker pool (kit.analysis.figure_render.map_forked) under real signals: a worker
killed mid-report, Ctrl-C, the report's process killed. Nothing hangs, nothing is left behind,
results keep their order."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kit.analysis.figure_render import map_forked

from .conftest import REPO, default_sigint

needs_fork = pytest.mark.skipif(not hasattr(os, "fork") or len(os.sched_getaffinity(0)) < 2,
                                reason="the pool needs fork and two cores")


@needs_fork
def test_a_killed_worker_leaves_its_jobs_to_the_report_in_order(tmp_path, capfd):
    parent = os.getpid()
    mark = tmp_path / "killed"

    def task(i: int) -> tuple[int, int]:
        if i == 5 and os.getpid() != parent and not mark.exists():
            mark.touch()
            os.kill(os.getpid(), signal.SIGKILL)  # a worker killed for memory, say
        return i, i * i

    assert map_forked(task, 12, workers=2) == [(i, i * i) for i in range(12)]
    assert mark.exists()
    assert capfd.readouterr().err.count("warning: a report worker died") == 1


SLOW = textwrap.dedent("""
    import os, sys, time
    from kit.analysis.figure_render import map_forked

    def task(i):
        os.write(1, f"worker {os.getpid()}\\n".encode())  # one write: lines never interleave
        time.sleep(30)
        return i

    try:
        map_forked(task, 8, workers=2)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
""")


def _start(tmp_path):
    """A process mapping slow jobs over two workers, and the workers' pids once both run."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            start_new_session=True, preexec_fn=default_sigint)
    workers = {int(proc.stdout.readline().split()[1]) for _ in range(2)}
    return proc, workers


def _gone(pids: set[int]) -> bool:
    """Whether every pid has ended (reaped, or a zombie of an ended parent)."""
    for _ in range(100):  # the kernel delivers the parent-death signal asynchronously
        alive = set()
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ")[1][0] != "Z":
                        alive.add(pid)
            except FileNotFoundError:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


@needs_fork
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_ctrl_c_stops_the_workers_and_their_jobs(tmp_path):
    proc, workers = _start(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole group
    out, _ = proc.communicate(timeout=25)  # the jobs sleep 30 s: not waited for
    assert proc.returncode == 130 and "interrupted" in out
    assert _gone(workers)


@needs_fork
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_workers_die_with_the_report(tmp_path):
    proc, workers = _start(tmp_path)
    proc.kill()
    proc.wait(timeout=25)
    assert _gone(workers)
