"""What the sampler process did: the report it writes beside its chunks.

The sampler process writes it once after its first tick (what a killed sampler leaves: its
sources and devices) and again, complete, when it ends; the parent and the bundle writer read it.
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kit.atomic_write import write_atomic
from kit.telemetry.base import FieldInfo

REPORT_NAME = "sampler-report.json"
"""File name of the report the sampler process writes into its chunks directory."""


@dataclass(frozen=True)
class SamplerErrorRecord:
    """One failure inside the sampler process.

    Attributes:
        t: Unix seconds when it happened.
        source: Name of the source that failed, or ``"sampler"`` for the loop itself.
        message: Exception type and message.
    """

    t: float
    source: str
    message: str


@dataclass
class SamplerReport:
    """What the sampler process did, written by it as ``sampler-report.json``.

    Attributes:
        interval_ms: Requested sampling period in milliseconds.
        ticks: Sampling ticks taken.
        rows_written: Rows in all chunk files.
        chunks: Chunk files written.
        mean_period_ms: Mean time between ticks in milliseconds; ``None`` under two ticks.
        missed_ticks: Ticks skipped because a tick overran its period.
        field_periods_ms: Per source name and field, the mean time between two rows holding
            a value of it, in milliseconds, on the device where it was longest (the fast
            fields' period is the ticks', a slow field's its own reader's).
        sources: Per source name, what it reported by ``fields()``.
        devices: Per source name, what it reported by ``devices()``.
        errors: Sources that failed to build or to sample (each then dropped), slow readers
            that failed (each then stopped), and any fatal error of the loop itself.
        rss_start_bytes: Resident memory of the process after its first tick.
        rss_first_chunk_bytes: Resident memory right after the first chunk was written (the
            Parquet writer's one-off allocations are done by then); 0 if none was.
        rss_peak_bytes: Largest resident memory seen: after the first tick, at every chunk
            write (where memory peaks: a full buffer and its Arrow table) and at the end.
        cpu_s: CPU time (user + system, every thread) the sampler process used from its start
            to its report, in seconds: its cost to the node.
        wall_s: Wall time from the process's start to its report, in seconds.
        measured_cpu_s: CPU time the process used between the first and the last poke at the
            measured phase's edges (kit.telemetry.edges): its cost while the job trained, its
            start-up (imports, device discovery) and the run's own start and end left out;
            ``None`` without two pokes.
        measured_wall_s: Wall time between those two pokes, seconds.
        measured_ticks: Ticks taken between them.
        measured_missed_ticks: Ticks missed between them.
        complete: True once the process finished normally; a report left by a process that
            was killed is the one it wrote after its first tick (sources and devices only).
        ended_by: What ended the sampling: "stop" (the parent asked), "parent gone",
            "SIGTERM", or null while it runs or when it was killed.
    """

    interval_ms: float
    ticks: int = 0
    rows_written: int = 0
    chunks: int = 0
    mean_period_ms: float | None = None
    missed_ticks: int = 0
    field_periods_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    sources: dict[str, dict[str, FieldInfo]] = field(default_factory=dict)
    devices: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    errors: list[SamplerErrorRecord] = field(default_factory=list)
    rss_start_bytes: int = 0
    rss_peak_bytes: int = 0
    rss_first_chunk_bytes: int = 0
    cpu_s: float | None = None
    wall_s: float | None = None
    measured_cpu_s: float | None = None
    measured_wall_s: float | None = None
    measured_ticks: int | None = None
    measured_missed_ticks: int | None = None
    complete: bool = False
    ended_by: str | None = None

    def write(self, path: Path) -> None:
        """Write the report as JSON, atomically."""
        text = json.dumps(asdict(self), indent=1)
        write_atomic(path, lambda tmp: tmp.write_text(text))

    @classmethod
    def read(cls, path: Path) -> "SamplerReport":
        """Read a report written by :meth:`write` (or by an older kit, without the newer keys)."""
        data = json.loads(path.read_text())
        data["sources"] = {
            name: {f: FieldInfo(**info) for f, info in fields.items()}
            for name, fields in data["sources"].items()
        }
        data["errors"] = [SamplerErrorRecord(**e) for e in data["errors"]]
        return cls(**data)
