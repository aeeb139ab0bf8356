"""Stall watchdog: a run whose ranks stop finishing steps ends ``failed``, naming who stopped.

A rank that stops without dying (a hung GPU, a stuck collective, a SIGSTOPped or page-faulting
process) otherwise holds every other rank in its next collective until the backend's own
timeout (10-30 minutes) or the job's end. The launcher of a one-node run, and each node agent
of a multi-node run, polls a :class:`StallWatchdog` with its progress display. It reads the
step records every rank streams (``ranks/rank<N>.steps.jsonl``) and trips when no rank has
finished a step for the limit of :class:`StallPolicy`:

* before every rank has finished its first step, and from a profiled step to the step after
  the profiled range (profiler start, trace export), the start-up allowance
  (:data:`STARTUP_ALLOWANCE_S`, or the run's ``--stall-timeout-s`` when larger);
* afterwards ``--stall-timeout-s``, or by default ``max(20 x median step, 120 s)`` over the
  last :data:`RECENT_STEPS` steps any rank finished (:data:`STEP_FACTOR`, :data:`FLOOR_S`);
* ``--stall-timeout-s 0`` turns it off; the fabric benchmark streams no steps and has none.

It does not trip after a SIGINT/SIGTERM (the interrupt path ends the run), once a rank on its
node has ended (the failure path does), or once every rank has finished its steps (teardown).

On a trip it claims ``logs/stall-watchdog.json`` (the first node to create it; the others see
it and follow), which asks every rank for its flight recorder, sends each local rank the stack
signal, waits up to :data:`DUMP_WAIT_S` for the stacks and recorders, runs py-spy where
installed (kit.launch.stall_evidence), then SIGKILLs its ranks (a stopped process dies too) and
rewrites the record with its verdict. The launcher's failure path then publishes the bundle with
everything streamed; :func:`stall_end` makes the verdict the bundle's headline error.

Blame, in this order, among the ranks whose last finished step is behind the others' (every
rank when none is: a step's collectives hold the ranks together): those whose process is
stopped or in uninterruptible sleep, that did not answer the stack signal (ranks of the
tripping node) or wrote no flight recorder while others did (ranks of any node); else those
whose flight recorder shows them in no collective while other ranks wait in theirs; else every
rank behind. A stopped rank's tensor-parallel partner waits inside the same step, so it is
behind too, and only the evidence tells the two apart. Where none stands out the error says so;
the per-rank evidence is in the record and the notes.
"""

import json
import os
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from kit.config.run import RunConfig
from kit.config.run_kind import run_kind
from kit.launch.rankfile import steps_log_path, write_json_atomic
from kit.launch.signals import SignalCounter
from kit.launch.stall_dumps import LOGS_DIR, STALL_RECORD, flight_recorder_path
from kit.launch.stall_evidence import (
    STOPPED_STATES,
    Collective,
    await_dumps,
    current,
    last_collectives,
    not_waiting,
    process_states,
    py_spy_dumps,
    request_stacks,
)

if TYPE_CHECKING:  # the bundle's assembly is imported while the ranks start (kit.launch.session)
    from kit.launch.assemble import RunEnd

STARTUP_ALLOWANCE_S = 900.0
"""Limit before every rank has finished its first step (model build, NCCL set-up, compile)."""
STEP_FACTOR = 20.0
FLOOR_S = 120.0
"""The default limit is ``max(STEP_FACTOR x median step, FLOOR_S)``."""
RECENT_STEPS = 512
"""Steps (over all ranks) whose median sets the default limit: the most recent ones."""
CHECK_S = 1.0
"""How often the step records are read."""
DUMP_WAIT_S = 10.0
"""How long the ranks get to write their stacks and flight recorders after a trip."""


@dataclass(frozen=True)
class StallPolicy:
    """How long a run may go without any rank finishing a step.

    Attributes:
        timeout_s: ``--stall-timeout-s``; None = derived from the median step.
        slow_steps: Steps whose completion may take the start-up allowance.
        total_steps: The most steps a rank may run (warmup included; a measured phase may
            extend itself, RunConfig.max_total_steps).
    """

    timeout_s: float | None
    slow_steps: frozenset[int]
    total_steps: int

    def steady_s(self, median_step_s: float | None) -> float:
        """The limit between ordinary steps."""
        if self.timeout_s is not None:
            return self.timeout_s
        if median_step_s is None:
            return STARTUP_ALLOWANCE_S
        return max(STEP_FACTOR * median_step_s, FLOOR_S)

    def limit_s(self, next_step: int, median_step_s: float | None) -> float:
        """The limit while the slowest rank's next step is ``next_step``."""
        steady = self.steady_s(median_step_s)
        return max(STARTUP_ALLOWANCE_S, steady) if next_step in self.slow_steps else steady

    def describe(self, next_step: int, median_step_s: float | None) -> str:
        """Where the limit came from, e.g. ``--stall-timeout-s 20``."""
        if next_step in self.slow_steps and self.limit_s(next_step, median_step_s) > (
                self.steady_s(median_step_s)):
            return f"the start-up allowance of {STARTUP_ALLOWANCE_S:g} s"
        if self.timeout_s is not None:
            return f"--stall-timeout-s {self.timeout_s:g}"
        return (f"{STEP_FACTOR:g} x the median step {median_step_s:.3g} s, at least "
                f"{FLOOR_S:g} s; --stall-timeout-s sets it")


def stall_policy(cfg: RunConfig) -> StallPolicy | None:
    """The run's policy, or None when it has no watchdog (turned off, or a run kind whose ranks
    stream no steps: the fabric benchmark)."""
    if cfg.stall_timeout_s == 0 or not run_kind(cfg).watched:
        return None
    slow = {0}
    if cfg.profile:
        from kit.launch.profiling import profiled_steps  # imports torch: profiled runs only

        profiled = profiled_steps(cfg)
        slow |= {*profiled, profiled.stop}
    return StallPolicy(cfg.stall_timeout_s, frozenset(slow), cfg.max_total_steps)


def stall_watchdog(cfg: RunConfig, staging: Path, node: int,
                   interrupts: SignalCounter) -> "StallWatchdog | None":
    """The watchdog of node ``node``'s ranks, or None when the run has none."""
    policy = stall_policy(cfg)
    if policy is None:
        return None
    local = min(cfg.ranks_per_node, cfg.world_size)
    return StallWatchdog(cfg, policy, staging, node, local, interrupts)


class StepProgress:
    """Every rank's last finished step, read incrementally from the streamed step records."""

    def __init__(self, staging: Path, world: int) -> None:
        self.last_step = [-1] * world
        self.recent_s: deque[float] = deque(maxlen=RECENT_STEPS)
        self._staging = staging
        self._offsets = [0] * world

    def read(self) -> bool:
        """Read what the ranks appended since the last call; whether any rank finished a step."""
        advanced = False
        for rank, offset in enumerate(self._offsets):
            path = steps_log_path(self._staging, rank)
            try:
                if path.stat().st_size <= offset:
                    continue
                with path.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._offsets[rank] += len(complete)
            for line in complete.splitlines():
                rec = json.loads(line)
                self.last_step[rank] = max(self.last_step[rank], int(rec["step"]))
                self.recent_s.append(float(rec["t_end"]) - float(rec["t_start"]))
                advanced = True
        return advanced

    @property
    def median_step_s(self) -> float | None:
        """Median duration of the recent steps, None before any."""
        return statistics.median(self.recent_s) if self.recent_s else None


def _ranks_text(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _after(step: int) -> str:
    return "before finishing any step" if step < 0 else f"after step {step}"


def _unresponsive(rank: int, states: dict[int, str], stacked: dict[int, bool],
                  unrecorded: set[int]) -> list[str]:
    """What singles ``rank``'s process out (its state and the dumps it did not write)."""
    out = []
    state = states.get(rank)
    if state in STOPPED_STATES:
        out.append(f"its process was stopped, state {'T' if state == 'stopped' else 't'}")
    elif state == psutil.STATUS_DISK_SLEEP:
        out.append("its process was in uninterruptible sleep, state D")
    if rank in stacked and not stacked[rank]:
        out.append("it wrote no stack when asked")
    if rank in unrecorded:
        out.append("it wrote no flight recorder when asked")
    return out


def stall_verdict(last_step: list[int], states: dict[int, str], stacked: dict[int, bool],
                  unrecorded: set[int], idle: dict[int, str]) -> tuple[list[int], str]:
    """The blamed ranks and the sentence that names them (module docstring, Blame).

    Args:
        last_step: Every rank's last finished step (-1: none).
        states: psutil status of this node's ranks before they were signalled.
        stacked: Per rank of this node, whether it wrote its stack when asked.
        unrecorded: Ranks, on any node, that wrote no flight recorder while others did.
        idle: Ranks in no collective while others wait (kit.launch.stall_evidence.not_waiting).
    """
    top = max(last_step)
    behind = [r for r in range(len(last_step)) if last_step[r] < top]
    pool = behind or list(range(len(last_step)))
    # a stopped rank's tensor-parallel partner is behind too (it waits inside the same step):
    # the evidence that names the stopped one narrows the ranks behind before blaming them all
    blamed = ([r for r in pool if _unresponsive(r, states, stacked, unrecorded)]
              or [r for r in pool if r in idle] or behind)
    if not blamed:
        return [], (f"every rank stopped {_after(top)} and none stands out (each answered, "
                    "none stopped, none outside a collective the others wait in)")
    parts = []
    for rank in blamed:
        clues = _unresponsive(rank, states, stacked, unrecorded) + (
            [f"flight recorder: {idle[rank]}"] if rank in idle else [])
        parts.append(f"rank {rank} stopped advancing {_after(last_step[rank])}"
                     + (f" ({'; '.join(clues)})" if clues else ""))
    others = [r for r in range(len(last_step)) if r not in blamed]
    if others:
        steps = sorted({last_step[r] for r in others})
        where = _after(steps[0]) if len(steps) == 1 else "after steps " + ", ".join(map(str, steps))
        parts.append(f"{_ranks_text(others)} waited {where}")
    return blamed, "; ".join(parts)


class StallWatchdog:
    """Polled by a launcher while its ranks run (module docstring).

    Attributes:
        tripped: Whether it ended the run's ranks on this node.
    """

    def __init__(self, cfg: RunConfig, policy: StallPolicy, staging: Path, node: int,
                 local_ranks: int, interrupts: SignalCounter) -> None:
        self.tripped = False
        self._policy, self._node = policy, node
        self._logs = staging / LOGS_DIR
        self._local_count, self._interrupts = local_ranks, interrupts
        self._progress = StepProgress(staging, cfg.world_size)
        self._procs: dict[int, psutil.Process] = {}
        self._t_progress = self._checked = time.monotonic()

    def know_ranks(self, pids: list[int]) -> None:
        """This node's ranks, by global rank (a launcher that started them says so: a forked
        rank's ``/proc`` environment is its zygote's, without ``RANK``)."""
        first = self._node * self._local_count
        for rank, pid in enumerate(pids, start=first):
            try:
                self._procs[rank] = psutil.Process(pid)
            except psutil.Error:
                continue

    @property
    def record_path(self) -> Path:
        """``logs/stall-watchdog.json``: the trip's claim, then its verdict."""
        return self._logs / STALL_RECORD

    def poll(self) -> None:
        """Look at the step records (every :data:`CHECK_S`); trip when the run has stalled."""
        now = time.monotonic()
        if self.tripped or now - self._checked < CHECK_S:
            return
        self._checked = now
        if self._progress.read():
            self._t_progress = now
        last = self._progress.last_step
        if (self._interrupts.count or min(last) >= self._policy.total_steps - 1
                or len(self._procs) < self._local_count
                or any(s in ("gone", psutil.STATUS_ZOMBIE)
                       for s in process_states(self._procs).values())):
            return
        median = self._progress.median_step_s
        limit = self._policy.limit_s(min(last) + 1, median)
        stalled = now - self._t_progress
        if stalled >= limit or self.record_path.exists():
            self._trip(stalled, limit, self._policy.describe(min(last) + 1, median))

    def _claim(self, record: dict[str, Any]) -> bool:
        """Create the record unless another node did; whether this node did."""
        try:
            fd = os.open(self.record_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2)
        return True

    def _trip(self, stalled_s: float, limit_s: float, limit: str) -> None:
        self.tripped = True
        last = list(self._progress.last_step)
        trip = {"node": self._node, "t": time.time(), "stalled_s": stalled_s,
                "limit_s": limit_s, "limit": limit, "last_step": last}
        claimed = self._claim({"state": "dumping", **trip})
        why = (f"no rank finished a step for {stalled_s:.0f} s (limit {limit_s:g} s: {limit})"
               if claimed else "another node's watchdog tripped")
        print(f"stall watchdog: {why}; dumping stacks, then ending the run", file=sys.stderr,
              flush=True)
        states = process_states(self._procs)
        sizes = request_stacks(self._procs, self._logs)
        running = [r for r in self._procs if states[r] not in STOPPED_STATES]
        expect = [r for r in range(len(last)) if states.get(r) not in STOPPED_STATES]
        stacked = await_dumps(self._logs, {r: sizes[r] for r in running}, expect, DUMP_WAIT_S)
        stacked.update({r: False for r in self._procs if r not in running})
        spied = py_spy_dumps(self._procs, [r for r in self._procs if r not in running],
                             self._logs)
        for proc in self._procs.values():
            try:
                proc.kill()
            except psutil.Error:
                continue
        if not claimed:
            return
        collectives = {r: c for r in range(len(last))
                       if (c := last_collectives(self._logs, r)) is not None}
        unrecorded = {r for r in range(len(last))
                      if not flight_recorder_path(self._logs, r).is_file()}
        if len(unrecorded) == len(last):  # no rank could: not a clue
            unrecorded = set()
        blamed, who = stall_verdict(last, states, stacked, unrecorded, not_waiting(collectives))
        where = "Python stacks in logs/rank<N>.log" + (
            ", flight recorders in logs/rank<N>.flight-recorder.json" if collectives else "") + (
            ", py-spy dumps in logs/rank<N>.py-spy.txt" if spied else "")
        error = (f"stalled: no rank finished a step for {stalled_s:.0f} s (limit {limit_s:g} s: "
                 f"{limit}); {who}; {where}")
        write_json_atomic(self.record_path, {
            "state": "ended", **trip, "blamed": blamed, "error": error,
            "ranks": {r: {"last_step": last[r], "process_state": states.get(r),
                          "wrote_stack": stacked.get(r),
                          "in_collective": _in(collectives.get(r)),
                          "collectives": [vars(c) for c in collectives.get(r, [])]}
                      for r in range(len(last))},
        })


def _in(collectives: list[Collective] | None) -> str | None:
    """What a rank's recorder says it was in, for the record."""
    if collectives is None:
        return None
    c = current(collectives)
    return c.describe() if c else "no collective"


def read_stall_record(logs_dir: Path) -> dict[str, Any] | None:
    """The watchdog's record in a staging folder's ``logs/``, or None when it did not trip."""
    try:
        return json.loads((logs_dir / STALL_RECORD).read_text())
    except (OSError, ValueError):
        return None


def stall_end(end: "RunEnd", logs_dir: Path) -> "RunEnd":
    """The run's end with the watchdog's verdict as its headline, when it tripped.

    An interrupted run stays interrupted; a rank that failed before the trip (its exit seen
    earlier) stays the headline, the stall a note.
    """
    record = read_stall_record(logs_dir)
    if record is None or end.status == "interrupted":
        return end
    error = record.get("error") or (
        f"stalled: node {record.get('node')}'s stall watchdog tripped after "
        f"{record.get('stalled_s', 0):.0f} s and ended before its verdict")
    earlier = [r for r, e in end.exits.items() if e.failed and e.t < record.get("t", 0)]
    if earlier:
        return replace(end, notes=[*end.notes, f"then {error}"])
    return replace(end, status="failed", error=error, notes=[*end.notes, *_rank_notes(record)])


def _rank_notes(record: dict[str, Any]) -> list[str]:
    """One note per rank: where it stopped and what the watchdog saw of it."""
    notes = []
    for rank, info in sorted((record.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
        seen = [f"last step {info.get('last_step')}"]
        if info.get("process_state"):
            seen.append(f"process {info['process_state']}")
        if info.get("wrote_stack") is not None:
            seen.append("stack dumped" if info["wrote_stack"] else "no stack dump")
        if info.get("in_collective"):
            seen.append(f"in {info['in_collective']}")
        notes.append(f"stall: rank {rank}: {'; '.join(seen)}")
    return notes
