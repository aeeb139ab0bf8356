"""How torch's elastic agent starts a node's ranks: spawned as torch does, or forked (CPU).

``LocalElasticAgent`` starts its workers with ``start_processes``, each a new interpreter that
imports torch and the engine again: 3.5 s of CPU per rank on a 2-core host, more than a
``gpt3-tiny`` rank then spends training. On a CPU platform a node's ranks are instead forked
from one zygote that imported for all (kit.launch.rank_fork), as a one-node run's are, and
:class:`ForkedRanks` is the agent's process context for them: torch's ``pids``, ``wait`` and
``close``, with failures reported as torch reports its own processes'.

torch's agent has no hook for how it starts workers, so :class:`RankStarter` stands in for its
``start_processes`` while the one agent of this process runs (:meth:`RankStarter.installed`).
Either way the starter keeps the ranks' pids by global rank: a forked rank's ``/proc``
environment is its zygote's, without ``RANK``, so the launcher is what names them.
"""

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.elastic.agent.server import local_elastic_agent
from torch.distributed.elastic.multiprocessing import start_processes
from torch.distributed.elastic.multiprocessing.api import RunProcsResult
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from kit.launch import rank_fork
from kit.launch.rank_fork import ForkedRank
from kit.launch.signals import SignalCounter

CLOSE_POLL_S = 0.05
"""How often :meth:`ForkedRanks.close` looks whether the ranks it signalled have ended."""
NOT_STARTED_PID = 0
"""The pid :class:`ForkedRanks` gives ranks that never started (the zygote failed): torch's
agent only compares pids; nothing signals them, since no such rank is ever running."""


class ForkedRanks:
    """torch's process context (its ``PContext``) over one node's forked ranks, by local rank.

    ``ended``: the code every rank is taken to have ended with when none was started (the
    zygote failed or was stopped while it imported), as a spawned rank would have.
    """

    def __init__(self, ranks: dict[int, ForkedRank], local_ranks: list[int],
                 ended: int | None = None) -> None:
        self._ranks = ranks
        self._running = set(ranks)
        self._failures: dict[int, ProcessFailure] = {}
        if ended is not None:
            for lr in local_ranks:
                self._failures[lr] = ProcessFailure(local_rank=lr, pid=NOT_STARTED_PID,
                                                    exitcode=ended, error_file="")
        self._local_ranks = local_ranks

    def pids(self) -> dict[int, int]:
        """The ranks' pids by local rank."""
        return {lr: (self._ranks[lr].pid if lr in self._ranks else NOT_STARTED_PID)
                for lr in self._local_ranks}

    def _poll(self) -> RunProcsResult | None:
        """As torch's ``SubprocessContext``: None while all run; once any failed or all ended,
        the others are closed and the result says how each failed rank ended.

        The failures are listed in the order they were found (kit.launch.elastic reads it as
        the order they ended in, where its own look saw them end together). Among ranks found
        failed in one look, those ended by a signal come first: a signal comes from outside
        the run (a kill, the OOM killer), while a peer's error exit in the same look is most
        often that rank's loss (gloo's "Connection reset by peer").
        """
        found = []
        for lr in sorted(self._running):
            code = self._ranks[lr].poll()
            if code is None:
                continue
            self._running.discard(lr)
            if code != 0:
                found.append((code >= 0, lr, code))
        for _, lr, code in sorted(found):
            self._failures[lr] = ProcessFailure(local_rank=lr, pid=self._ranks[lr].pid,
                                                exitcode=code, error_file="")
        if self._running and not self._failures:
            return None
        self.close()
        result = RunProcsResult(failures=dict(self._failures))
        if not result.is_failed():
            result.return_values = dict.fromkeys(self._local_ranks)
        return result

    def wait(self, timeout: float = -1, period: float = 1) -> RunProcsResult | None:
        """The result once the ranks are done (see :meth:`_poll`), polling every ``period``
        for at most ``timeout`` seconds (0: look once; negative: until then)."""
        end = None if timeout < 0 else time.monotonic() + timeout
        while True:
            result = self._poll()
            if result is not None or (end is not None and time.monotonic() >= end):
                return result
            time.sleep(period if end is None else max(0.0, min(period, end - time.monotonic())))

    def close(self, death_sig: signal.Signals | None = None, timeout: float = 30) -> None:
        """Send ``death_sig`` (SIGTERM) to the ranks still running, SIGKILL those still
        running after ``timeout``, and reap them (a rank in uninterruptible sleep is left
        after another ``timeout``, as torch leaves it)."""
        for sig in (death_sig or signal.SIGTERM, signal.SIGKILL):
            running = [r for r in self._ranks.values() if r.poll() is None]
            for rank in running:
                rank.send_signal(sig)
            deadline = time.monotonic() + timeout
            while any(r.poll() is None for r in running) and time.monotonic() < deadline:
                time.sleep(CLOSE_POLL_S)
            self._running = {lr for lr, r in self._ranks.items() if r.returncode is None}
            if not self._running:
                return


class RankStarter:
    """Starts the workers of torch's agent in this process and keeps their pids by global rank.

    Args:
        fork: Fork the ranks from a zygote (a CPU platform, :func:`rank_fork.usable`), else
            start them as torch does.
        worker: The module each rank runs (it must have ``preload`` and ``run_rank`` to be
            forked: kit.launch.worker).
        staging: The run's staging folder, the worker's argument.
        logs_dir: Where each rank's log goes (``rank<N>.log``).
        interrupts: The kit's signal counter: a signal while the zygote imports stops it.
        on_started: Called with the ranks' pids, in global rank order, once they started.
    """

    def __init__(self, fork: bool, worker: str, staging: Path, logs_dir: Path,
                 interrupts: SignalCounter,
                 on_started: Callable[[list[int]], None] | None = None) -> None:
        self._fork, self._worker, self._staging, self._logs = fork, worker, staging, logs_dir
        self._interrupts, self._on_started = interrupts, on_started
        self.pids: dict[int, int] = {}
        """Pids of the ranks started, by global rank (empty until they are)."""

    def __call__(self, name: str, entrypoint: Any, args: dict[int, tuple],
                 envs: dict[int, dict[str, str]], **kwargs: Any) -> Any:
        """torch's ``start_processes``, called by the agent with its workers' environments."""
        if self._fork:
            context = self._forked(envs)
        else:
            context = start_processes(name=name, entrypoint=entrypoint, args=args, envs=envs,
                                      **kwargs)
        started = {int(envs[lr]["RANK"]): pid for lr, pid in context.pids().items()
                   if pid != NOT_STARTED_PID}
        self.pids = started
        if started and self._on_started is not None:
            self._on_started([started[r] for r in sorted(started)])
        return context

    def _forked(self, envs: dict[int, dict[str, str]]) -> ForkedRanks:
        by_rank = {int(env["RANK"]): {**os.environ, **env} for env in envs.values()}
        local = {int(env["RANK"]): lr for lr, env in envs.items()}
        try:
            forked = rank_fork.fork_ranks(self._worker, self._staging, by_rank, self._logs,
                                          self._interrupts, None, CLOSE_POLL_S)
        except rank_fork.ZygoteFailed as e:  # every rank ended as its imports did
            return ForkedRanks({}, sorted(envs), ended=e.returncode)
        if forked is None:  # a signal came while it imported: the ranks end as if by it
            return ForkedRanks({}, sorted(envs), ended=-int(signal.SIGTERM))
        return ForkedRanks({local[r]: p for r, p in forked.items()}, sorted(envs))

    @contextmanager
    def installed(self) -> Iterator["RankStarter"]:
        """Be torch's agent's ``start_processes`` meanwhile (this process runs one agent)."""
        original = local_elastic_agent.start_processes
        local_elastic_agent.start_processes = self
        try:
            yield self
        finally:
            local_elastic_agent.start_processes = original
