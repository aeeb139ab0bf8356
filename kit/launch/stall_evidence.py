"""The evidence the stall watchdog (kit.launch.watchdog) gathers before it kills a stalled run.

For each rank on this node: its process state as psutil reads it (``stopped``, state T, after a
SIGSTOP or under a debugger; ``disk-sleep``, state D, in an uninterruptible wait such as a
driver call or a page-fault storm), whether it wrote its Python stack into its log when asked
(kit.launch.stall_dumps), and, where ``py-spy`` is on PATH, a ``py-spy dump`` into
``logs/rank<N>.py-spy.txt``: with native frames (it suspends the process for that), or for a
stopped process, which it cannot suspend, ``--nonblocking`` (Python frames only, read from its
memory). For every rank, on any node (the logs folder is shared): the collective it was in,
from its flight recorder.
"""

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from kit.launch.stall_dumps import STACK_MARK, STACK_SIGNAL, flight_recorder_path

STOPPED_STATES = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
"""Process states of a rank that cannot run until someone continues it (state T or t)."""
PY_SPY_TIMEOUT_S = 20.0
"""How long one ``py-spy dump`` may take."""
POLL_S = 0.2


def rank_log(logs_dir: Path, rank: int) -> Path:
    """A rank's log, where its stack dumps land."""
    return logs_dir / f"rank{rank}.log"


def process_states(procs: dict[int, psutil.Process]) -> dict[int, str]:
    """psutil's status of each rank's process (``gone`` when it has ended)."""
    out = {}
    for rank, proc in procs.items():
        try:
            out[rank] = proc.status()
        except psutil.Error:
            out[rank] = "gone"
    return out


def request_stacks(procs: dict[int, psutil.Process], logs_dir: Path) -> dict[int, int]:
    """Ask every rank for its stacks; return each log's size before the request."""
    sizes = {}
    for rank, proc in procs.items():
        log = rank_log(logs_dir, rank)
        sizes[rank] = log.stat().st_size if log.is_file() else 0
        try:
            proc.send_signal(STACK_SIGNAL)
        except psutil.Error:
            continue
    return sizes


def wrote_stack(logs_dir: Path, rank: int, offset: int) -> bool:
    """Whether ``rank``'s log holds a stack dump past ``offset``."""
    try:
        with rank_log(logs_dir, rank).open("rb") as f:
            f.seek(offset)
            return STACK_MARK in f.read()
    except OSError:
        return False


def await_dumps(logs_dir: Path, stacks: dict[int, int], recorders: list[int],
                timeout_s: float) -> dict[int, bool]:
    """Wait until the ranks in ``stacks`` wrote a stack and those in ``recorders`` their flight
    recorder, or ``timeout_s``; return per rank of ``stacks`` whether its stack came."""
    deadline = time.monotonic() + timeout_s
    while True:
        stacked = {r: wrote_stack(logs_dir, r, offset) for r, offset in stacks.items()}
        recorded = all(flight_recorder_path(logs_dir, r).is_file() for r in recorders)
        if (all(stacked.values()) and recorded) or time.monotonic() > deadline:
            return stacked
        time.sleep(POLL_S)


def py_spy_dumps(procs: dict[int, psutil.Process], stopped: list[int], logs_dir: Path) -> list[int]:
    """``py-spy dump`` of every rank into ``logs/rank<N>.py-spy.txt``, all at once (``stopped``
    ranks ``--nonblocking``); return the ranks it ran for (none without py-spy on PATH)."""
    exe = shutil.which("py-spy")
    if exe is None:
        return []
    running = {}
    for rank, proc in procs.items():
        how = "--nonblocking" if rank in stopped else "--native"
        out = (logs_dir / f"rank{rank}.py-spy.txt").open("w")
        running[rank] = (subprocess.Popen([exe, "dump", how, "--pid", str(proc.pid)],
                                          stdout=out, stderr=subprocess.STDOUT), out)
    for proc, out in running.values():
        try:
            proc.wait(PY_SPY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            out.write(f"\npy-spy did not finish within {PY_SPY_TIMEOUT_S:g} s\n")
        out.close()
    return sorted(running)


@dataclass(frozen=True)
class Collective:
    """The last collective one rank's flight recorder holds for one process group.

    Attributes:
        group: The process group's name (the same on every rank of the group).
        desc: Its description, e.g. ``TENSOR_MODEL_PARALLEL_GROUP`` (megatron-core's).
        seq: Its collective sequence number in that group (1 = the group's first).
        op: What it was, e.g. ``nccl:all_reduce``.
        state: ``scheduled``, ``started`` or ``completed``.
        record: Its position in the rank's recorder (the latest entry has the highest).
        waiting: Whether the rank was inside it: not retired, and on NCCL also started (an
            NCCL collective only ``scheduled`` is enqueued behind work its stream has not
            finished; gloo runs a collective on the calling thread and never marks it started).
    """

    group: str
    desc: str
    seq: int
    op: str
    state: str
    record: int
    waiting: bool

    def describe(self) -> str:
        """E.g. ``#57 of group 15 (TENSOR_MODEL_PARALLEL_GROUP): nccl:all_reduce, started``."""
        desc = f" ({self.desc})" if self.desc else ""
        return f"#{self.seq} of group {self.group}{desc}: {self.op}, {self.state}"


def _collective(e: dict[str, Any]) -> Collective:
    group = [str(x) for x in (e.get("process_group") or [e.get("pg_id"), ""])]
    op, state = str(e.get("profiling_name", "?")), str(e.get("state", "?"))
    waiting = not e.get("retired", state == "completed") and state != "completed" and (
        state == "started" or not op.startswith("nccl"))
    return Collective(group[0], group[1] if len(group) > 1 else "",
                      int(e.get("collective_seq_id", 0)), op, state,
                      int(e.get("record_id", 0)), waiting)


def last_collectives(logs_dir: Path, rank: int) -> list[Collective] | None:
    """Per process group the last collective ``rank``'s flight recorder holds, by group name;
    None when it wrote none (or said it has none)."""
    try:
        dump = json.loads(flight_recorder_path(logs_dir, rank).read_text())
    except (OSError, ValueError):
        return None
    if "entries" not in dump:
        return None
    last: dict[str, Collective] = {}
    for e in dump["entries"]:
        if e.get("is_p2p"):
            continue
        c = _collective(e)
        if c.group not in last or c.seq >= last[c.group].seq:
            last[c.group] = c
    return sorted(last.values(), key=lambda c: c.group)


def current(collectives: list[Collective]) -> Collective | None:
    """The collective a rank was waiting in (its latest such), else None."""
    waiting = [c for c in collectives if c.waiting]
    return max(waiting, key=lambda c: c.record) if waiting else None


def not_waiting(collectives: dict[int, list[Collective]]) -> dict[int, str]:
    """Ranks in no collective while other ranks wait in theirs: the ones they wait for.

    Returns:
        Per such rank, what the recorders say, e.g. ``in no collective while group 1 waits in
        #7 (gloo:all_reduce); its last there #6``. Empty when no rank waits.
    """
    waits = {r: current(cs) for r, cs in collectives.items()}
    if not any(waits.values()):
        return {}
    out = {}
    for rank, colls in sorted(collectives.items()):
        if waits[rank] is not None:
            continue
        mine = {c.group: c for c in colls}
        held = [(w, mine[w.group]) for w in waits.values()
                if w is not None and w.group in mine and mine[w.group].seq < w.seq]
        if held:
            w, m = held[0]
            out[rank] = (f"in no collective while {w.describe()} waits for it (its last in "
                         f"that group #{m.seq})")
        else:
            out[rank] = "in no collective while the other ranks wait in theirs"
    return out
