"""Fork a CPU run's local ranks from one process that imported torch and the engine once.

Each rank started as its own interpreter imports torch and the training engine again: about
4 s of CPU per rank on a 2-core host, where a 2-rank ``gpt3-tiny`` run spends 12 s of CPU in
all (measured 2026-12-06, issue 40). Here one process, the *zygote*
(``python -m kit.launch.rank_fork WORKER STAGING``), imports the worker module and the run's
engine (the worker's ``preload``), then forks every rank; each rank is then what an
``exec``-ed one would be: its own session, its rank's environment and log, ``run_rank``.

The zygote runs nothing but imports: a process that ran an OpenMP region cannot fork a child
that uses OpenMP again (the child hangs), and no thread of its own is running. It is used for
CPU platforms only: a GPU rank's start is bounded by the device's set-up, not by the CPU, and
it keeps the plain start that every engine documents. A one-node run's launcher forks all
ranks (kit.launch.local). A multi-node run's ranks are started by torch's elastic agent as
torchrun starts them (kit.launch.elastic): forking them there would mean standing in for the
agent's private process-start interface.

The ranks must be the launcher's children, which it reaps and signals as it does spawned
ones. The launcher is a child subreaper (Linux ``prctl``) while the zygote runs: the zygote
exits as soon as it has forked every rank and sent their pids, and its orphaned ranks are
re-parented to the launcher. A rank waits for that before it runs, so that its watch on its
parent (kit.launch.worker) sees the launcher. Forked ranks have the zygote's command line
(``... kit.launch.rank_fork kit.launch.worker STAGING``, found as ranks are), but not their
rank's variables in ``/proc/PID/environ``: the launcher names them by pid (its record).
"""

import ctypes
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import psutil

from kit.launch.signals import SignalCounter
from kit.lifecycle import process_start_time

PR_SET_CHILD_SUBREAPER = 36
"""``prctl`` option (linux/prctl.h): orphaned descendants are re-parented to this process."""
RANK_SIGNALS = {signal.SIGTERM, signal.SIGINT}
"""Blocked while the zygote forks, and in each rank until its handlers are set (worker)."""
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "ROLE_RANK")
"""Variables of one rank that the zygote's own environment leaves out."""


def _set_subreaper(on: bool) -> bool:
    """Make this process a child subreaper (or not); whether the kernel took it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def usable(cpu: bool) -> bool:
    """Whether this run's ranks are forked: a CPU platform on Linux (``fork``, ``prctl``). Every
    run kind's worker module can be (kit.config.run_kind)."""
    return cpu and sys.platform == "linux" and _set_subreaper(False)


class ForkedRank:
    """A forked rank, the launcher's child: the part of ``subprocess.Popen`` the launcher uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Reap the rank if it has ended; its ``Popen``-style return code, or None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        """Reap the rank (one thread does); its ``Popen``-style return code."""
        _, status = os.waitpid(self.pid, 0)
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the rank unless it was reaped (its pid may be another process's by then)."""
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the rank."""
        self.send_signal(signal.SIGKILL)


class ZygoteFailed(Exception):
    """The zygote ended without forking the ranks; ``returncode`` is how (``Popen``-style)."""

    def __init__(self, returncode: int) -> None:
        super().__init__(f"the ranks' zygote ended with {returncode}")
        self.returncode = returncode


def fork_ranks(
    worker: str,
    staging: Path,
    envs: dict[int, dict[str, str]],
    logs_dir: Path,
    interrupts: SignalCounter,
    on_poll: Callable[[], None] | None,
    poll_s: float,
) -> dict[int, ForkedRank] | None:
    """Start the zygote, wait while it imports and forks, and return the ranks it forked.

    ``envs`` holds each rank's whole environment, by global rank. What the imports print goes
    to the first rank's log, which that rank then appends to.

    While it imports, ``on_poll`` runs every ``poll_s``; a signal counted by ``interrupts``
    stops it (SIGTERM, a second one SIGKILL): then no rank is started and None is returned.

    Raises:
        ZygoteFailed: It ended without forking (an import failed: its traceback ends
            first rank's log), or the kernel refused the subreaper.
    """
    if not _set_subreaper(True):
        raise ZygoteFailed(1)
    try:
        return _run_zygote(worker, staging, envs, logs_dir, interrupts, on_poll, poll_s)
    finally:
        _set_subreaper(False)  # the ranks are re-parented by now; later orphans go to init


def _run_zygote(worker: str, staging: Path, envs: dict[int, dict[str, str]], logs_dir: Path,
                interrupts: SignalCounter, on_poll: Callable[[], None] | None,
                poll_s: float) -> dict[int, ForkedRank] | None:
    base = {k: v for k, v in envs[min(envs)].items() if k not in RANK_VARIABLES}
    plan = {str(r): {"env": env, "log": str(logs_dir / f"rank{r}.log")} for r, env in envs.items()}
    with (logs_dir / f"rank{min(envs)}.log").open("w") as log:
        zygote = subprocess.Popen(
            [sys.executable, "-m", __name__, worker, str(staging)], env=base,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    assert zygote.stdin is not None and zygote.stdout is not None
    try:
        zygote.stdin.write(json.dumps(plan).encode() + b"\n")
        zygote.stdin.close()
    except BrokenPipeError:  # it died at once; its return code says how
        pass
    answer = b""
    seen = 0
    while True:
        if interrupts.count > seen:
            zygote.send_signal(signal.SIGTERM if seen == 0 else signal.SIGKILL)
            seen = interrupts.count
        if on_poll is not None:
            on_poll()
        ready, _, _ = select.select([zygote.stdout], [], [], poll_s)
        if ready:
            chunk = os.read(zygote.stdout.fileno(), 65536)
            answer += chunk
            if not chunk or answer.endswith(b"\n"):
                break
    zygote.stdout.close()
    returncode = zygote.wait()  # its ranks are this process's children from here on
    try:
        pids = [int(p) for p in json.loads(answer)] if answer.endswith(b"\n") else None
    except ValueError:
        pids = None
    if pids is None:
        _kill_strays(zygote.args)  # ranks forked before it died, nobody's to reap
        if interrupts.count:
            return None
        raise ZygoteFailed(returncode or 1)
    return {r: ForkedRank(pid) for r, pid in zip(sorted(envs), pids, strict=True)}


def _kill_strays(cmd: list[str]) -> None:
    """SIGKILL and reap this process's children that are copies of a dead zygote."""
    for child in psutil.Process().children():
        try:
            if child.cmdline() == cmd:
                child.kill()
                child.wait(10)
        except psutil.Error:
            continue


def _rank(worker_module: object, staging: Path, spec: dict, started: float, zygote: int,
          answer_fd: int) -> None:
    """In a forked rank: become the rank ``spec`` describes and run it; never returns."""
    code = 1
    try:
        os.close(answer_fd)
        os.setsid()
        # appended: the first rank's log begins with the zygote's output; the others are new
        log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.update(spec["env"])
        while os.getppid() == zygote:  # until re-parented to the launcher (module docstring)
            time.sleep(0.001)
        code = worker_module.run_rank(staging, started=started)  # type: ignore[attr-defined]
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def zygote_main(worker: str, staging: Path) -> None:
    """The zygote: import, fork every rank of the plan read on stdin, send their pids, exit."""
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the imports print goes to the log, the pids alone to the launcher
    plan = json.loads(sys.stdin.readline())
    started = process_start_time()
    module = importlib.import_module(worker)
    module.preload(staging)  # type: ignore[attr-defined]
    signal.pthread_sigmask(signal.SIG_BLOCK, RANK_SIGNALS)
    sys.stdout.flush()
    sys.stderr.flush()
    pids = []
    me = os.getpid()  # not the child's getppid(): this process may have exited by then
    for rank in sorted(plan, key=int):
        pid = os.fork()
        if pid == 0:
            _rank(module, staging, plan[rank], started, me, answer.fileno())
        pids.append(pid)
    try:
        answer.write(json.dumps(pids) + "\n")
        answer.flush()
    except OSError:  # the launcher is gone: the ranks see it and stop (kit.launch.worker)
        pass
    os._exit(0)


if __name__ == "__main__":
    zygote_main(sys.argv[1], Path(sys.argv[2]))
