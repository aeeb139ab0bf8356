"""The files a rank and its launcher exchange inside the bundle's staging directory.

``run-config.json`` (the resolved RunConfig, written by the launcher), ``ranks/rank<N>.json``
(each rank's result, written atomically at exit) and ``ranks/rank<N>.steps.jsonl`` (each rank's
steps as they end: a rank killed before its exit leaves the steps it ran, and the launcher
shows progress from rank 0's).
"""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from kit.spec.run import RunConfig

CONFIG_FILE = "run-config.json"
RANKS_DIR = "ranks"


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


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def write_config(staging: Path, cfg: RunConfig) -> None:
    """Store the resolved config for the ranks to read."""
    write_json_atomic(staging / CONFIG_FILE, cfg.model_dump(mode="json"))


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


def open_steps_log(staging: Path, rank: int) -> IO[str]:
    """The file a rank appends one :class:`StepRecord` line to after every step."""
    path = steps_log_path(staging, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("a", encoding="utf-8")


def append_step(log: IO[str], record: StepRecord, stage: int) -> None:
    """Append ``record`` (and the rank's pipeline stage) and flush it to the OS."""
    log.write(json.dumps({**asdict(record), "stage": stage}) + "\n")
    log.flush()


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
