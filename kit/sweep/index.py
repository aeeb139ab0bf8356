"""The sweep index (``sweep.json`` in the sweep folder): every point, its status and bundle.

Rewritten atomically after every point, so a sweep stopped at any moment leaves an index that
says how far it got.
"""

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kit.atomic_write import write_atomic

INDEX_FILE = "sweep.json"
SUMMARY_FIELDS = ("step_time_s", "tokens_per_s", "mfu", "energy_j_per_token")

PointStatus = Literal["ok", "failed", "oom", "interrupted", "error", "skipped", "pending"]


class PointRecord(BaseModel):
    """One point of the sweep as the index records it."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Folder of the point inside the sweep folder.")
    values: dict[str, Any] = Field(description="The point's axis values (base not repeated).")
    status: PointStatus = Field(
        description="A run's bundle status (ok/failed/oom/interrupted); error = the kit could "
        "not run it (exception, see reason); skipped = not run (see reason); pending = not "
        "reached yet.")
    reason: str | None = Field(None, description="Why skipped, or the run's error.")
    bundle: str | None = Field(None, description="Bundle path relative to the sweep folder.")
    job: str | None = Field(
        None, description="The Slurm job that runs the point (sweep --launcher slurm).")
    resumed: bool = Field(False, description="Bundle from an earlier run, kept by --resume.")
    summary: dict[str, float | int | None] = Field(
        default_factory=dict, description="step_time_s, tokens_per_s, mfu, energy_j_per_token "
        "from the bundle's metrics.json (null where not measurable).")


class SweepIndex(BaseModel):
    """The whole ``sweep.json``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    name: str
    sweep_file: str = Field(description="The sweep file as given; a copy sits beside the index.")
    updated_utc: str
    points: list[PointRecord]


def write_index(folder: Path, index: SweepIndex) -> Path:
    """Write ``index`` to ``folder/sweep.json`` atomically (temporary file, then rename)."""
    index.updated_utc = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = folder / INDEX_FILE
    text = json.dumps(index.model_dump(mode="json"), indent=2) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text))
    return path


def summary_subset(summary: dict[str, Any]) -> dict[str, Any]:
    """The figures a sweep table shows, from a bundle's summary."""
    return {k: summary.get(k) for k in SUMMARY_FIELDS}
