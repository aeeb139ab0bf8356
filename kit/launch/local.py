"""Start every rank of a one-node run as a local process, torchrun-style, and watch them.

Each rank is ``python -m kit.launch.worker STAGING`` with the usual torch.distributed
environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Ranks run in their own
process session, so a Ctrl-C reaches only the launcher, which forwards it as SIGTERM: ranks then
stop together at the next step boundary. When one rank fails, its peers (likely blocked in a
collective) get a grace period and are then killed.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kit.spec.run import RunConfig

FAILURE_GRACE_S = 10.0
INTERRUPT_GRACE_S = 120.0


def free_port() -> int:
    """A TCP port that is free on this host right now."""
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
    return env


@dataclass
class LaunchOutcome:
    """How the ranks ended."""

    exit_codes: dict[int, int | None] = field(default_factory=dict)
    interrupted: bool = False
    killed: list[int] = field(default_factory=list)


class _Interrupts:
    """Turn SIGINT/SIGTERM to the launcher into a flag while ranks run."""

    def __init__(self) -> None:
        self.count = 0
        self._old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def __enter__(self) -> "_Interrupts":
        for s in self._old:
            signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1


def launch_local(
    cfg: RunConfig,
    staging: Path,
    logs_dir: Path,
    on_poll: Callable[[], None] | None = None,
    poll_s: float = 0.2,
) -> LaunchOutcome:
    """Run all ranks of ``cfg`` on this host and wait for them; never raises on rank failure."""
    world = cfg.world_size
    threads = max(1, (os.cpu_count() or 1) // world) if cfg.platform.is_cpu else 4
    port = free_port()
    logs_dir.mkdir(parents=True, exist_ok=True)
    procs: dict[int, subprocess.Popen] = {}
    outcome = LaunchOutcome()
    with _Interrupts() as interrupts:
        for r in range(world):
            log = (logs_dir / f"rank{r}.log").open("w")
            procs[r] = subprocess.Popen(
                [sys.executable, "-m", "kit.launch.worker", str(staging)],
                env=rank_env(r, world, port, threads),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
        deadline: float | None = None
        forwarded = False
        while True:
            codes = {r: p.poll() for r, p in procs.items()}
            if all(c is not None for c in codes.values()):
                break
            if interrupts.count and not forwarded:
                outcome.interrupted = True
                forwarded = True
                for p in procs.values():
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + INTERRUPT_GRACE_S
            if interrupts.count > 1 and deadline is not None:
                deadline = time.monotonic()  # a second Ctrl-C: stop waiting
            if deadline is None and any(c not in (None, 0) for c in codes.values()):
                deadline = time.monotonic() + FAILURE_GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                for r, p in procs.items():
                    if p.poll() is None:
                        p.kill()
                        outcome.killed.append(r)
                for p in procs.values():
                    p.wait()
                break
            if on_poll is not None:
                on_poll()
            time.sleep(poll_s)
        outcome.exit_codes = {r: p.poll() for r, p in procs.items()}
        if on_poll is not None:
            on_poll()
    return outcome
