"""The files a rank and its launcher exchange inside the bundle's staging directory.

``launcher.json`` (who launched the run: pid, host, command; ``bundle recover`` reads it),
``nodes/node<K>.json`` (a multi-node run's node agents: who they are, then how their ranks
ended; node 0 merges them), ``agents/`` (torch's elastic agents' own files),
``run-config.json`` (the resolved RunConfig, written by the launcher), ``ranks/rank<N>.json``
(each rank's result, written atomically at exit) and ``ranks/rank<N>.steps.jsonl`` (each rank's
steps as they end: a rank killed before its exit leaves the steps it ran, and the launcher
shows progress from rank 0's).
"""

import errno
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from kit.atomic_write import write_atomic
from kit.config.run import RunConfig

CONFIG_FILE = "run-config.json"
RANKS_DIR = "ranks"
LAUNCHER_FILE = "launcher.json"
NODES_DIR = "nodes"
AGENTS_DIR = "agents"
UNPUBLISHED_MARK = "unpublished"
SCRATCH = (CONFIG_FILE, RANKS_DIR, LAUNCHER_FILE, NODES_DIR, AGENTS_DIR, UNPUBLISHED_MARK)
"""What the launcher and ranks exchange in a staging folder; not part of the bundle."""


@dataclass
class StepRecord:
    """One step on one rank; times are unix seconds after device synchronization."""

    step: int
    phase: str
    t_start: float
    t_end: float
    tokens: int
    loss: float | None
    gpu_energy_j: float | None = None
    phases: dict[str, float] | None = None
    """Seconds of the step by phase, where the engine measures them (StepResult.phases)."""
    expert_tokens: dict[str, list[int]] | None = None
    """Tokens routed to each expert by MoE layer, where counted (StepResult.expert_tokens)."""


@dataclass
class RankResult:
    """What one rank reports at exit."""

    rank: int
    local_rank: int
    node: int
    status: str = "failed"
    error: str | None = None
    placement: dict[str, int] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    mem_peak_bytes: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    measured_energy_j: float | None = None
    """Zeus energy of this rank's GPU over the whole measured phase, joules."""
    timeline: dict[str, float] = field(default_factory=dict)
    """When the rank passed each of :data:`kit.lifecycle.RANK_PHASES` (unix seconds)."""


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2)
    write_atomic(path, lambda tmp: tmp.write_text(text))


def write_config(staging: Path, cfg: RunConfig) -> None:
    """Store the resolved config for the ranks to read."""
    write_json_atomic(staging / CONFIG_FILE, cfg.model_dump(mode="json"))


@dataclass(frozen=True)
class LauncherRecord:
    """Who launched a run, so a staging folder it left can be recovered once it is dead.

    Attributes:
        pid: The launcher's process id.
        host: Host name it ran on.
        create_time: Its process start time (psutil, unix seconds): with ``pid`` it tells the
            launcher from a later process that got the same pid.
        command: The argv that started the run.
        rank_pids: Process ids of the ranks it started, once started.
    """

    pid: int
    host: str
    create_time: float
    command: list[str]
    rank_pids: list[int] = field(default_factory=list)

    def alive(self) -> list[int]:
        """Pids of the launcher and its ranks that still run (empty on another host)."""
        if self.host != socket.gethostname():
            return []
        out = []
        for pid in (self.pid, *self.rank_pids):
            try:
                # A pid reused by a later process started after the launcher (ranks did too).
                proc = psutil.Process(pid)
                same = (abs(proc.create_time() - self.create_time) < 1.0 if pid == self.pid
                        else "kit.launch.worker" in proc.cmdline())
            except psutil.Error:
                continue
            if same:
                out.append(pid)
        return out


def write_launcher_record(staging: Path, command: list[str], rank_pids: list[int]) -> None:
    """Store this process as the run's launcher, with the pids of the ranks it started."""
    record = LauncherRecord(os.getpid(), socket.gethostname(),
                            psutil.Process().create_time(), list(command), rank_pids)
    write_json_atomic(staging / LAUNCHER_FILE, {**asdict(record), "written": time.time()})


def read_launcher_record(staging: Path) -> LauncherRecord:
    """Load the launcher record of a staging folder.

    Raises:
        OSError: It is missing or unreadable.
        ValueError: It is not a launcher record.
    """
    data = json.loads((staging / LAUNCHER_FILE).read_text())
    try:
        return LauncherRecord(int(data["pid"]), str(data["host"]), float(data["create_time"]),
                              [str(a) for a in data["command"]],
                              [int(p) for p in data["rank_pids"]])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{staging / LAUNCHER_FILE} is not a launcher record: {e}") from e


def read_config(staging: Path) -> RunConfig:
    """Load the resolved config a launcher stored."""
    return RunConfig.model_validate_json((staging / CONFIG_FILE).read_text())


def write_rank_result(staging: Path, result: RankResult) -> None:
    """Store one rank's result."""
    write_json_atomic(staging / RANKS_DIR / f"rank{result.rank}.json", asdict(result))


def read_rank_result(staging: Path, rank: int) -> RankResult | None:
    """Load one rank's result, or None when the rank died before writing it."""
    path = staging / RANKS_DIR / f"rank{rank}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    data["steps"] = [StepRecord(**s) for s in data["steps"]]
    return RankResult(**data)


def steps_log_path(staging: Path, rank: int) -> Path:
    """Where ``rank`` streams its steps (:func:`append_step`)."""
    return staging / RANKS_DIR / f"rank{rank}.steps.jsonl"


def marks_path(staging: Path, rank: int) -> Path:
    """Where ``rank`` streams its start-up marks (:mod:`kit.lifecycle`)."""
    return staging / RANKS_DIR / f"rank{rank}.marks.jsonl"


def open_steps_log(staging: Path, rank: int) -> IO[str]:
    """The file a rank appends one :class:`StepRecord` line to after every step."""
    path = steps_log_path(staging, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("a", encoding="utf-8")


def append_step(log: IO[str], record: StepRecord, stage: int) -> None:
    """Append ``record`` (and the rank's pipeline stage) and flush it to the OS.

    Raises:
        OSError: The write failed; it names the log's path (a flush's own error does not).
    """
    try:
        log.write(json.dumps({**asdict(record), "stage": stage}) + "\n")
        log.flush()
    except OSError as e:
        raise OSError(e.errno, e.strerror, log.name) from e


def recover_rank_result(staging: Path, rank: int) -> RankResult | None:
    """What a rank that died without its result file left: its streamed steps, as failed.

    Only its steps and pipeline stage are known (for ``steps.parquet``); a line torn by the
    kill is dropped. None when the rank logged no step.
    """
    path = steps_log_path(staging, rank)
    steps, stage = [], 0
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        stage = data.pop("stage", stage)
        steps.append(StepRecord(**data))
    if not steps:
        return None
    return RankResult(rank=rank, local_rank=rank, node=0, placement={"pp_rank": stage},
                      steps=steps)


@dataclass
class NodeRecord:
    """What one node agent of a multi-node run tells node 0, through the shared folder.

    Written when the agent starts (``ended`` False) and again when its ranks are done: a record
    still not ``ended`` when node 0 assembles is an agent that died without a word.

    Attributes:
        node: Node index.
        host: Host name of the agent.
        pid: The agent's process id.
        ranks: Global ranks this node started.
        inventory: Its :class:`~kit.bundle.schema.NodeInventory`, as JSON.
        ended: Whether its ranks are done and this record says how.
        exits: Per global rank, how its process ended: ``[code, signal, t]`` (t on this node's
            clock, unix seconds).
        interrupted_by: What stopped the node (a signal to the agent), or None.
        killed: Ranks the agent killed after their grace.
        error: The agent's own failure (the elastic agent raised), or None.
        notes: Notes for ``metrics.json`` (telemetry problems).
        clock_start: This node's :class:`~kit.launch.clock.ClockOffset` before training, as a
            dict; None on node 0.
        create_time: The agent's process start time (psutil): with ``pid`` it tells the agent
            from a later process that got the same pid (``bundle recover``).
        slurm_job_id: The Slurm job the agent ran in, if any (``bundle recover`` records it).
        rank_pids: Process ids of its ranks, in rank order, once started (a forked rank's
            ``/proc`` environment is its zygote's, without ``RANK``).
    """

    node: int
    host: str
    pid: int
    ranks: list[int]
    inventory: dict[str, Any]
    ended: bool = False
    exits: dict[int, list[Any]] = field(default_factory=dict)
    interrupted_by: str | None = None
    killed: list[int] = field(default_factory=list)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    clock_start: dict[str, float] | None = None
    create_time: float | None = None
    slurm_job_id: str | None = None
    rank_pids: list[int] = field(default_factory=list)

    def agent_alive(self) -> bool:
        """Whether the agent still runs (False when it ran on another host: cannot tell)."""
        return self.host == socket.gethostname() and _same_process(self.pid, self.create_time)


def _same_process(pid: int, create_time: float | None) -> bool:
    """Whether ``pid`` runs and is the process that started at ``create_time``."""
    try:
        proc = psutil.Process(pid)
        return create_time is None or abs(proc.create_time() - create_time) < 1.0
    except psutil.Error:
        return False


def running_ranks(staging: Path) -> list[int]:
    """Pids of rank processes on this host that run on the staging folder ``staging``.

    Found by their command line (``python -m kit.launch.worker STAGING``), resolved against
    their working folder: a rank whose launcher died is no longer anyone's child.
    """
    target = staging.resolve()
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        argv = proc.info["cmdline"] or []
        if "kit.launch.worker" not in argv or argv[-1] == "kit.launch.worker":
            continue
        try:
            where = Path(proc.cwd()) / argv[argv.index("kit.launch.worker") + 1]
        except (psutil.Error, IndexError):
            continue
        if where.resolve() == target:
            out.append(proc.info["pid"])
    return out


def write_node_record(staging: Path, record: NodeRecord) -> None:
    """Store one node agent's record."""
    write_json_atomic(staging / NODES_DIR / f"node{record.node}.json", asdict(record))


def read_node_record(staging: Path, node: int) -> NodeRecord | None:
    """Load one node agent's record, or None when it never wrote one."""
    path = staging / NODES_DIR / f"node{node}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    data["exits"] = {int(r): v for r, v in data["exits"].items()}
    return NodeRecord(**data)


def mark_unpublished(staging: Path, error: OSError) -> None:
    """Leave in ``staging`` why the launcher could not publish its bundle (best effort).

    The mark is a symbolic link whose target is the error's name (``ENOSPC``): a short link
    lives in its inode, so it fits on the full disk that stopped the bundle, where a file's
    content would not. ``bundle recover`` reads it (:func:`unpublished_reason`).
    """
    name = errno.errorcode.get(error.errno or 0)
    if name is None:
        return
    try:
        os.symlink(name, staging / UNPUBLISHED_MARK)
    except OSError:
        pass


def unpublished_reason(staging: Path) -> str | None:
    """Why the launcher could not publish (e.g. ``no space left on device``), or None."""
    try:
        code = getattr(errno, os.readlink(staging / UNPUBLISHED_MARK), None)
    except OSError:
        return None
    if not isinstance(code, int):
        return None
    return "no space left on device" if code == errno.ENOSPC else os.strerror(code).lower()
