"""Start and watch one node's ranks of a multi-node run with torch's elastic agent (torchrun's).

The agent is torch.distributed.elastic's ``LocalElasticAgent``, as ``torchrun`` runs it, with
the static rendezvous (``--node-rank`` fixes each node's place, so node K holds ranks
K x per-node .. ) on node 0's endpoint, and no restarts: a failed rank ends the run, whose bundle
says so. Each rank is the run kind's worker (kit.config.run_kind: kit.launch.worker, or
kit.fabric.worker for the fabric benchmark) with its output in ``logs/rank<N>.log``; the agent
starts it as torchrun does and sets RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE and MASTER_ADDR.
The kit reads the ranks' pids through the agent's public ``get_worker_group`` and replaces
nothing of torch's: a one-node CPU run forks its ranks from one zygote (kit.launch.rank_fork),
a node agent's ranks each import for themselves (3.5 s of CPU a rank on a 2-core host), which
costs only CPU-only multi-node tests their time.

SIGINT and SIGTERM stay with the kit's signal counter (the agent handles only SIGHUP and
SIGQUIT its own way): a watcher thread forwards the first as SIGTERM to the ranks, which stop
together at the next step boundary, as the local launcher does, and kills them after the grace.
"""

import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from torch.distributed.elastic.agent.server.api import WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from kit.config.run import RunConfig
from kit.config.run_kind import run_kind
from kit.launch.local import (
    FAILURE_GRACE_S,
    INTERRUPT_GRACE_S,
    LAUNCHER_PID_ENV,
    LaunchOutcome,
    RankExit,
)
from kit.launch.rankfile import AGENTS_DIR
from kit.launch.rendezvous import NodeRole
from kit.launch.signals import SignalCounter

EXIT_BARRIER_S = 5.0
"""How long an agent whose ranks all exited 0 waits for the other agents (torch's exit barrier).

Node 0 waits for the others' records itself, with their heartbeats, so this wait only has to
cover ranks that end a little apart. It must stay well under Slurm's KillWait (30 s by default)
minus INTERRUPT_GRACE_S: after scancel, an agent whose ranks stopped at the step boundary (exit 0)
while the other node's ranks were killed (the node got a second SIGTERM, through srun) or failed
waits the whole barrier, since those agents never enter it; at 30 s it was still waiting
inside torch's agent when Slurm's SIGKILL came, and no bundle was published."""
AGENT_SIGNALS = "SIGHUP,SIGQUIT"
"""Signals the elastic agent turns into its own shutdown; SIGINT/SIGTERM are the kit's."""
WATCH_S = 0.05
"""How often the watcher looks for ranks that ended (their exit times' resolution)."""
WORKER_SHELL = 'exec "$0" -m "$3" "$1" >"$2/rank$RANK.log" 2>&1'
"""Each rank: the worker module, its output in its rank's log (RANK comes from the agent)."""


def _signal_ranks(sig: signal.Signals, pids: dict[int, int]) -> list[int]:
    """Send ``sig`` to every rank still running (``pids`` by global rank); the ranks reached."""
    reached = []
    for rank, pid in sorted(pids.items()):
        if _has_exited(pid):
            continue
        try:
            os.kill(pid, sig)
            reached.append(rank)
        except ProcessLookupError:
            continue
    return reached


def _has_exited(pid: int) -> bool:
    """Whether this agent's child ``pid`` has ended, without reaping it (torch's agent does)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped by the agent
        return True


class _Watcher(threading.Thread):
    """Forwards the kit's counted signals to the ranks, notes when each rank's process ends
    and calls ``on_poll`` while they run.

    torch's agent stamps a failure with the whole second it noticed it, the same second for
    the rank that died and for the peers it then terminated: too coarse to tell which rank
    ended first, on this node or against another node's ranks. ``ended`` holds, per global
    rank, when this watcher first saw its process gone (every :data:`WATCH_S`).
    """

    def __init__(self, interrupts: SignalCounter, outcome: LaunchOutcome,
                 on_poll: Callable[[], None] | None, agent: LocalElasticAgent,
                 on_started: Callable[[list[int]], None] | None) -> None:
        super().__init__(daemon=True, name="rank-watcher")
        self.done = threading.Event()
        self.ended: dict[int, float] = {}
        self.pids: dict[int, int] = {}
        """The node's ranks' pids by global rank, once the agent has started them."""
        self._agent, self._on_started = agent, on_started
        self._interrupts, self._outcome, self._on_poll = interrupts, outcome, on_poll

    def _note_pids(self) -> None:
        """Learn the ranks' pids once the agent has started them (torch's public
        ``get_worker_group``: a started worker's ``id`` is its process id), and say so once."""
        if self.pids:
            return
        workers = self._agent.get_worker_group().workers
        if workers and all(w.id is not None and w.global_rank >= 0 for w in workers):
            self.pids = {w.global_rank: int(w.id) for w in workers}
            if self._on_started is not None:
                self._on_started([self.pids[r] for r in sorted(self.pids)])

    def _note_exits(self) -> None:
        """Stamp the ranks that ended since the last look."""
        now = time.time()
        for rank, pid in self.pids.items():
            if rank not in self.ended and _has_exited(pid):
                self.ended[rank] = now

    def run(self) -> None:
        seen, deadline, polled = 0, None, 0.0
        termed: set[int] = set()  # ranks sent SIGTERM (those started after the signal too)
        while not self.done.wait(WATCH_S):
            self._note_pids()
            self._note_exits()
            if time.monotonic() - polled < 0.2:
                continue
            polled = time.monotonic()
            if self._interrupts.count > seen:
                if seen == 0:
                    self._outcome.interrupted = True
                    deadline = time.monotonic() + INTERRUPT_GRACE_S
                else:
                    deadline = time.monotonic()
                seen = self._interrupts.count
            if seen and self.pids.keys() - termed:
                fresh = {r: p for r, p in self.pids.items() if r not in termed}
                _signal_ranks(signal.SIGTERM, fresh)
                termed |= fresh.keys()
            if deadline is not None and time.monotonic() > deadline:
                self._outcome.killed += _signal_ranks(signal.SIGKILL, self.pids)
                deadline = None
            if self._on_poll is not None:
                self._on_poll()
        self._note_pids()  # ranks that started and ended between two looks
        self._note_exits()  # ranks the agent reaped since the last look


def _failure_exits(failures: dict[int, ProcessFailure],
                   ended: dict[int, float]) -> dict[int, RankExit]:
    """How the failed ranks ended, in the order they ended.

    The watcher's look (:data:`WATCH_S`) times each rank; ranks it first saw ended in the same
    look are ordered by how they ended, then by torch's list. A rank killed by a signal the
    agent does not send (SIGKILL from outside, SIGSEGV) comes first: its peers can only react
    to its death, within milliseconds (a gloo read that finds the connection reset), whereas
    it cannot be a reaction to theirs. torch lists the ranks it found ended by local rank, then
    those it terminated because of them (SIGTERM, then SIGKILL), so a peer torch terminated is
    never taken for the first rank to end.
    """
    def key(item: tuple[int, tuple[int, ProcessFailure]]) -> tuple[float, int, int]:
        index, (r, failure) = item
        from_outside = failure.exitcode < 0 and -failure.exitcode != signal.SIGTERM
        return ended.get(r, float(failure.timestamp)), 0 if from_outside else 1, index

    exits: dict[int, RankExit] = {}
    last = 0.0
    for _, (r, failure) in sorted(enumerate(failures.items()), key=key):
        t = max(ended.get(r, float(failure.timestamp)), last + 1e-6 if exits else 0.0)
        last = t
        code = failure.exitcode
        exits[r] = (RankExit(None, failure.signal_name(), t) if code < 0
                    else RankExit(code, None, t))
    return exits


def _shutdown_grace() -> dict[str, int]:
    """The agent's wait between SIGTERM and SIGKILL when it stops ranks: the kit's
    FAILURE_GRACE_S where this torch's agent takes it (``shutdown_timeout``); torch 2.11's
    agent has no such argument and always waits its own 30 s."""
    if "shutdown_timeout" in inspect.signature(LocalElasticAgent.__init__).parameters:
        return {"shutdown_timeout": int(FAILURE_GRACE_S)}
    return {}


def _worker_spec(cfg: RunConfig, staging: Path, logs_dir: Path, role: NodeRole,
                 worker: str) -> WorkerSpec:
    params = RendezvousParameters(
        backend="static", endpoint=role.endpoint, run_id=role.run_id, min_nodes=role.nodes,
        max_nodes=role.nodes, rank=role.node, timeout=int(role.timeout_s),
    )
    return WorkerSpec(
        role="trainer", local_world_size=cfg.ranks_per_node,
        rdzv_handler=get_rendezvous_handler(params), entrypoint="/bin/sh",
        args=("-c", WORKER_SHELL, sys.executable, str(staging), str(logs_dir), worker),
        max_restarts=0, monitor_interval=0.1, master_addr=role.host, master_port=role.port,
    )


def launch_elastic(
    cfg: RunConfig,
    staging: Path,
    logs_dir: Path,
    role: NodeRole,
    interrupts: SignalCounter,
    on_poll: Callable[[], None] | None = None,
    on_started: Callable[[list[int]], None] | None = None,
) -> LaunchOutcome:
    """Run this node's ranks of ``cfg`` under torch's elastic agent and wait for them.

    ``interrupts`` must be active around the call; each rank runs its run kind's worker
    module, started by the agent. ``on_started`` gets the ranks' pids, in rank order, once
    they are started.
    Exit times of failed ranks are when the watcher saw them end (:func:`_failure_exits`), else
    the whole second torch's agent stamped; of ranks that succeeded, the end of the run.

    Raises:
        Exception: Whatever the agent raised (a rendezvous that failed); the caller records it.
    """
    worker = run_kind(cfg).worker
    outcome = LaunchOutcome()
    if interrupts.count:
        outcome.interrupted = True
        return outcome
    per_node = cfg.ranks_per_node
    threads = max(1, (os.cpu_count() or 1) // per_node) if cfg.platform.is_cpu else 4
    os.environ.update({"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                       LAUNCHER_PID_ENV: str(os.getpid()),
                       "TORCHELASTIC_SIGNALS_TO_HANDLE": AGENT_SIGNALS})
    logs_dir.mkdir(parents=True, exist_ok=True)
    agent_dir = staging / AGENTS_DIR / f"node{role.node}"
    agent_dir.mkdir(parents=True, exist_ok=True)
    agent = LocalElasticAgent(
        spec=_worker_spec(cfg, staging, logs_dir, role, worker),
        logs_specs=DefaultLogsSpecs(log_dir=str(agent_dir)),
        start_method="spawn", exit_barrier_timeout=EXIT_BARRIER_S, **_shutdown_grace(),
    )
    watcher = _Watcher(interrupts, outcome, on_poll, agent, on_started)
    watcher.start()
    outcome.started = True
    try:
        result = agent.run()
    finally:
        watcher.done.set()
        watcher.join()
    ranks = range(role.node * per_node, (role.node + 1) * per_node)
    if result.state == WorkerState.SUCCEEDED:
        t = time.time()
        outcome.exits = {r: RankExit(0, None, t) for r in ranks}
    else:
        outcome.exits = _failure_exits(result.failures, watcher.ended)
    if on_poll is not None:
        on_poll()
    return outcome
