"""Start and watch one node's ranks of a multi-node run with torch's elastic agent (torchrun's).

The agent is torch.distributed.elastic's ``LocalElasticAgent``, as ``torchrun`` runs it, with
the static rendezvous (``--node-rank`` fixes each node's place, so node K holds ranks
K x per-node .. ) on node 0's endpoint, and no restarts: a failed rank ends the run, whose bundle
says so. Each rank is the kit's worker (kit.launch.worker) with its output in
``logs/rank<N>.log``; the agent sets RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE and MASTER_ADDR.

SIGINT and SIGTERM stay with the kit's signal counter (the agent handles only SIGHUP and
SIGQUIT its own way): a watcher thread forwards the first as SIGTERM to the ranks, which stop
together at the next step boundary, as the local launcher does, and kills them after the grace.
"""

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from torch.distributed.elastic.agent.server.api import WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

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
from kit.spec.run import RunConfig

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
WORKER_SHELL = 'exec "$0" -m kit.launch.worker "$1" >"$2/rank$RANK.log" 2>&1'
"""Each rank: the kit's worker, its output in its rank's log (RANK comes from the agent)."""


def _workers() -> list[psutil.Process]:
    """This agent's rank processes (the kit's workers among its children)."""
    out = []
    for child in psutil.Process().children():
        try:
            if "kit.launch.worker" in child.cmdline():
                out.append(child)
        except psutil.Error:
            continue
    return out


def _signal_workers(sig: signal.Signals) -> list[int]:
    """Send ``sig`` to every rank still running; return the ranks it reached."""
    reached = []
    for proc in _workers():
        try:
            rank = int(proc.environ().get("RANK", "-1"))
            proc.send_signal(sig)
            reached.append(rank)
        except psutil.Error:
            continue
    return reached


class _Watcher(threading.Thread):
    """Forwards the kit's counted signals to the ranks and calls ``on_poll`` while they run."""

    def __init__(self, interrupts: SignalCounter, outcome: LaunchOutcome,
                 on_poll: Callable[[], None] | None) -> None:
        super().__init__(daemon=True, name="rank-watcher")
        self.done = threading.Event()
        self._interrupts, self._outcome, self._on_poll = interrupts, outcome, on_poll

    def run(self) -> None:
        seen, deadline = 0, None
        while not self.done.wait(0.2):
            if self._interrupts.count > seen:
                if seen == 0:
                    self._outcome.interrupted = True
                    _signal_workers(signal.SIGTERM)
                    deadline = time.monotonic() + INTERRUPT_GRACE_S
                else:
                    deadline = time.monotonic()
                seen = self._interrupts.count
            if deadline is not None and time.monotonic() > deadline:
                self._outcome.killed += _signal_workers(signal.SIGKILL)
                deadline = None
            if self._on_poll is not None:
                self._on_poll()


def _worker_spec(cfg: RunConfig, staging: Path, logs_dir: Path, role: NodeRole) -> WorkerSpec:
    params = RendezvousParameters(
        backend="static", endpoint=role.endpoint, run_id=role.run_id, min_nodes=role.nodes,
        max_nodes=role.nodes, rank=role.node, timeout=int(role.timeout_s),
    )
    return WorkerSpec(
        role="trainer", local_world_size=cfg.ranks_per_node,
        rdzv_handler=get_rendezvous_handler(params), entrypoint="/bin/sh",
        args=("-c", WORKER_SHELL, sys.executable, str(staging), str(logs_dir)),
        max_restarts=0, monitor_interval=0.1, master_addr=role.host, master_port=role.port,
    )


def launch_elastic(
    cfg: RunConfig,
    staging: Path,
    logs_dir: Path,
    role: NodeRole,
    interrupts: SignalCounter,
    on_poll: Callable[[], None] | None = None,
) -> LaunchOutcome:
    """Run this node's ranks of ``cfg`` under torch's elastic agent and wait for them.

    ``interrupts`` must be active around the call. Exit times are those the agent saw
    (whole seconds, torch's ``ProcessFailure.timestamp``) for failed ranks, and the end of the
    run for ranks that succeeded.

    Raises:
        Exception: Whatever the agent raised (a rendezvous that failed); the caller records it.
    """
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
        spec=_worker_spec(cfg, staging, logs_dir, role),
        logs_specs=DefaultLogsSpecs(log_dir=str(agent_dir)),
        start_method="spawn", exit_barrier_timeout=EXIT_BARRIER_S,
        shutdown_timeout=int(FAILURE_GRACE_S),
    )
    watcher = _Watcher(interrupts, outcome, on_poll)
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
        for r, failure in result.failures.items():
            code = failure.exitcode
            outcome.exits[r] = (RankExit(None, failure.signal_name(), float(failure.timestamp))
                                if code < 0 else RankExit(code, None, float(failure.timestamp)))
    if on_poll is not None:
        on_poll()
    return outcome
