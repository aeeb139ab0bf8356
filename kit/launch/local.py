"""Start every rank of a one-node run as a local process, torchrun-style, and watch them.

Each rank is ``python -m kit.launch.worker STAGING`` with the usual torch.distributed
environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and the launcher's pid, so
it stops when the launcher dies (see kit.launch.worker); on a CPU platform the ranks are forked
from one process that imported torch and the engine for all (kit.launch.rank_fork). Ranks run
in their own process session, so a Ctrl-C reaches only the launcher, which forwards it as
SIGTERM: ranks then stop together at the next step boundary. When one rank fails, its peers
(likely blocked in a collective) get a grace period and are then killed. Each rank has a thread
that reaps it and notes when it ended, so the first rank to end is known to the millisecond.
"""

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kit.config.run import RunConfig
from kit.config.run_kind import run_kind
from kit.launch import rank_fork
from kit.launch.rank_fork import ForkedRank
from kit.launch.signals import SignalCounter

FAILURE_GRACE_S = 10.0
"""After a rank fails: how long its peers get to end before they are killed."""
INTERRUPT_GRACE_S = 20.0
"""After SIGINT/SIGTERM: how long ranks get to reach a step boundary before they are killed
(a second signal kills them at once). With the sampler's and the assembly's few seconds this
publishes the bundle well within Slurm's default 30 s between SIGTERM and SIGKILL."""
REAP_TIMEOUT_S = 10.0
"""How long a SIGKILLed rank may take to be reaped (a process in uninterruptible sleep in a
device driver can take a while) before the launcher stops waiting for it."""
LAUNCHER_PID_ENV = "CHARLLM_LAUNCHER_PID"
"""Environment variable that tells a rank which process must outlive it."""


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Linux's range of ports handed to outgoing connections and to ``bind`` on port 0."""
STORE_PORTS = (20000, 32767)
"""Where :func:`free_port` looks first: below Linux's default ephemeral range (32768-60999)."""


def _ephemeral_range() -> tuple[int, int] | None:
    try:
        lo, hi = (int(v) for v in EPHEMERAL_RANGE.read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port free on this host right now, for rank 0's rendezvous store.

    Not one from ``bind(("", 0))``: that comes from the ephemeral range, which the kernel also
    hands to every outgoing connection, so between this check and rank 0 binding it, another
    process's ``connect`` (the previous sweep point's ranks still closing theirs, a peer's NCCL
    bootstrap) can take it: rank 0 then fails with EADDRINUSE (seen once in 22 points of a
    2 x H200 sweep). A port below the ephemeral range that binds now is taken only by another
    listener choosing the same one; without a readable range (not Linux), ``bind`` on port 0.
    """
    ephemeral = _ephemeral_range()
    if ephemeral is not None:
        lo, hi = STORE_PORTS
        candidates = [p for p in range(lo, hi + 1) if not ephemeral[0] <= p <= ephemeral[1]]
        for port in random.sample(candidates, min(64, len(candidates))):
            if _bindable(port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world: int, port: int, threads: int) -> dict[str, str]:
    """Environment of one local rank."""
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
    )
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    return env


@dataclass(frozen=True)
class RankExit:
    """How and when one rank's process ended.

    Attributes:
        code: Exit code, or None when a signal ended it.
        signal: Name of the signal that ended it (e.g. ``"SIGKILL"``), or None.
        t: Unix seconds when the launcher reaped it.
    """

    code: int | None
    signal: str | None
    t: float

    @classmethod
    def from_returncode(cls, returncode: int, t: float) -> "RankExit":
        """From ``Popen.returncode`` (negative: the number of the signal that ended it)."""
        if returncode < 0:
            return cls(None, signal.Signals(-returncode).name, t)
        return cls(returncode, None, t)

    @property
    def failed(self) -> bool:
        """Ended by a signal or with a non-zero code."""
        return self.code != 0

    def describe(self) -> str:
        """E.g. ``killed by SIGKILL`` or ``exit code 1``."""
        return f"killed by {self.signal}" if self.signal else f"exit code {self.code}"


@dataclass
class LaunchOutcome:
    """How the ranks ended.

    Attributes:
        exits: Per rank that was started and reaped, how and when it ended.
        started: Whether ranks were started at all (not when a signal came first).
        interrupted: SIGINT/SIGTERM reached the launcher while ranks ran (or before).
        killed: Ranks the launcher killed after their grace period.
    """

    exits: dict[int, RankExit] = field(default_factory=dict)
    started: bool = False
    interrupted: bool = False
    killed: list[int] = field(default_factory=list)


class _Reapers:
    """One thread per rank waiting for its process, recording how and when it ended."""

    def __init__(self, procs: dict[int, subprocess.Popen | ForkedRank]) -> None:
        self.exits: dict[int, RankExit] = {}
        self.changed = threading.Event()
        self._threads = [
            threading.Thread(target=self._reap, args=(r, p), daemon=True, name=f"reap-rank{r}")
            for r, p in procs.items()
        ]
        for t in self._threads:
            t.start()

    def _reap(self, rank: int, proc: subprocess.Popen | ForkedRank) -> None:
        returncode = proc.wait()
        self.exits[rank] = RankExit.from_returncode(returncode, time.time())
        self.changed.set()

    def join(self, timeout_s: float) -> None:
        """Wait (bounded) for every reaper."""
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


def _start_rank(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with log_path.open("w") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def launch_local(
    cfg: RunConfig,
    staging: Path,
    logs_dir: Path,
    interrupts: SignalCounter,
    on_started: Callable[[list[int], float], None] | None = None,
    on_poll: Callable[[], None] | None = None,
    poll_s: float = 0.2,
) -> LaunchOutcome:
    """Run all ranks of ``cfg`` on this host and wait for them; never raises on rank failure.

    ``interrupts`` must be active (``with``) around the call: a signal already counted means
    no rank is started. ``on_started`` gets the ranks' pids, in rank order, once they are
    started, and when their processes were begun (a forked rank's: its zygote's). Each rank
    runs ``python -m WORKER STAGING`` (its run kind's worker, kit.config.run_kind), or on a CPU
    platform is forked from one process that imported for all (kit.launch.rank_fork).
    """
    world = cfg.world_size
    worker = run_kind(cfg).worker
    threads = max(1, (os.cpu_count() or 1) // world) if cfg.platform.is_cpu else 4
    port = free_port()
    logs_dir.mkdir(parents=True, exist_ok=True)
    outcome = LaunchOutcome()
    if interrupts.count:
        outcome.interrupted = True
        return outcome
    envs = {r: rank_env(r, world, port, threads) for r in range(world)}
    spawned = time.time()
    procs: dict[int, subprocess.Popen | ForkedRank]
    if rank_fork.usable(cfg.platform.is_cpu):
        try:
            forked = rank_fork.fork_ranks(worker, staging, envs, logs_dir, interrupts, on_poll,
                                          poll_s)
        except rank_fork.ZygoteFailed as e:  # every rank ended as its imports did
            outcome.started = True
            ended = RankExit.from_returncode(e.returncode, time.time())
            outcome.exits = dict.fromkeys(range(world), ended)
            return outcome
        if forked is None:  # a signal came while it imported: no rank started
            outcome.interrupted = True
            return outcome
        procs = dict(forked)
    else:
        cmd = [sys.executable, "-m", worker, str(staging)]
        procs = {r: _start_rank(cmd, env, logs_dir / f"rank{r}.log") for r, env in envs.items()}
    outcome.started = True
    if on_started is not None:
        on_started([procs[r].pid for r in range(world)], spawned)
    reapers = _Reapers(procs)
    deadline: float | None = None
    seen = 0  # signals already acted on
    while len(reapers.exits) < world:
        if interrupts.count > seen:
            if seen == 0:
                outcome.interrupted = True
                for r, p in procs.items():
                    if r not in reapers.exits:
                        p.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + INTERRUPT_GRACE_S
            else:
                deadline = time.monotonic()  # a second signal: stop waiting
            seen = interrupts.count
        if deadline is None and any(e.failed for e in list(reapers.exits.values())):
            deadline = time.monotonic() + FAILURE_GRACE_S
        if deadline is not None and time.monotonic() > deadline:
            for r, p in procs.items():
                if r not in reapers.exits:
                    p.kill()
                    outcome.killed.append(r)
            reapers.join(REAP_TIMEOUT_S)
            break
        if on_poll is not None:
            on_poll()
        reapers.changed.wait(poll_s)
        reapers.changed.clear()
    outcome.exits = dict(reapers.exits)
    if on_poll is not None:
        on_poll()
    return outcome
