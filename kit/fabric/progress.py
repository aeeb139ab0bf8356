"""Show a fabric run's progress while it measures: rank 0 reports each point, the launcher
prints it, so the table at the end is not preceded by half a minute of silence.

Rank 0 appends one JSON line per measured point to ``ranks/rank0.fabric.jsonl`` in the staging
folder (scratch, not part of the bundle); :class:`FabricProgress` has the launcher's progress
watcher interface (``poll``, ``close``) and prints what it measures, then each line.
"""

import sys
from pathlib import Path

from kit.config.fabric import FabricSpec
from kit.config.run import RunConfig
from kit.fabric.results import FabricPoint
from kit.launch.rankfile import RANKS_DIR


def progress_path(staging: Path) -> Path:
    """Where rank 0 reports the points it measured."""
    return staging / RANKS_DIR / "rank0.fabric.jsonl"


def report_point(staging: Path, point: FabricPoint) -> None:
    """Append ``point`` to the progress file (rank 0, after each point)."""
    path = progress_path(staging)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(point.model_dump_json() + "\n")


def _size(size_bytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale} {unit}"
    return f"{size_bytes} B"


class FabricProgress:
    """Print what a fabric run measures, then one line per point as rank 0 reports it."""

    @classmethod
    def for_run(cls, cfg: RunConfig, staging: Path, label: str) -> "FabricProgress":
        """The points of the fabric run ``cfg`` staged in ``staging``."""
        assert isinstance(cfg.workload, FabricSpec), "a fabric run's workload is a FabricSpec"
        return cls(staging, cfg.workload, label, cfg.world_size,
                   cfg.workload.graph and not cfg.platform.is_cpu)

    def __init__(self, staging: Path, spec: FabricSpec, label: str, ranks: int,
                 graph: bool) -> None:
        self.path, self.label = progress_path(staging), label
        self.total = len(spec.ops) * len(spec.sizes_bytes)
        self._offset, self._seen = 0, 0
        sizes = _size(spec.sizes_bytes[0])
        if len(spec.sizes_bytes) > 1:
            sizes += f" to {_size(spec.sizes_bytes[-1])}"
        how = "a host loop and a CUDA graph" if graph else "a host loop"
        print(f"{label}: starting {ranks} ranks to time {', '.join(spec.ops)} at "
              f"{len(spec.sizes_bytes)} size(s), {sizes}, in {how}: {self.total} points",
              file=sys.stderr, flush=True)

    def poll(self) -> None:
        """Print the points reported since the last poll."""
        if not self.path.is_file():
            return
        with self.path.open(encoding="utf-8") as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self._offset += len(complete.encode())
        for line in complete.splitlines():
            p = FabricPoint.model_validate_json(line)
            self._seen += 1
            graph = (f", graph {p.graph_time_s * 1e6:.1f} us" if p.graph_time_s is not None
                     else "")
            print(f"{self.label}: {self._seen}/{self.total} {p.op} {_size(p.size_bytes)} "
                  f"x{p.iterations}: {p.time_s * 1e6:.1f} us{graph}, busbw "
                  f"{p.busbw_gbps:.3f} GB/s", file=sys.stderr, flush=True)

    def say(self, info: str) -> None:
        """Say what the run is doing now (the launcher's teardown)."""
        print(f"{self.label}: {info}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Print what is left."""
        self.poll()

