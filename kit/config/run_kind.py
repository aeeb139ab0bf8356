"""What kind of run a config describes, training or the fabric benchmark, and what differs.

A run either trains a workload model through an engine or measures collectives (``charllm-kit
fabric``: a :class:`kit.config.fabric.FabricSpec` for its workload). Both launch, sample and
leave a bundle the same way; what differs is said here once, instead of asked by hand where it
matters: the module each rank runs, the launcher's progress display, whether the stall watchdog
applies, and whether the bundle describes a training step (engine, layout, batch, step
metrics). Code asks :func:`run_kind` and reads a field.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kit.config.targets import import_target

if TYPE_CHECKING:
    from kit.config.run import RunConfig


@dataclass(frozen=True)
class RunKind:
    """One kind of run."""

    name: Literal["training", "fabric"]
    worker: str
    """The module each rank runs (``python -m WORKER STAGING``). It has ``preload(staging)``
    and ``run_rank(staging, started=...)`` and unblocks the rank signals once it handles them,
    so a CPU zygote can fork it (kit.launch.rank_fork)."""
    progress: str
    """``"module:Class"`` of the launcher's progress display; the class is built with
    ``for_run(cfg, staging, label)`` and has ``poll``, ``say`` and ``close``."""
    watched: bool
    """Whether its ranks stream steps, so the stall watchdog applies (kit.launch.watchdog)."""
    trains: bool
    """Whether a workload model trains: an engine, a layout, a batch, a model-FLOPs figure and
    step metrics in the bundle (a fabric run has none of these)."""

    def progress_class(self) -> Any:
        """The progress display's class, imported now."""
        return import_target(self.progress)


TRAINING = RunKind("training", worker="kit.launch.worker",
                   progress="kit.launch.progress:ProgressWatcher", watched=True, trains=True)
FABRIC = RunKind("fabric", worker="kit.fabric.worker",
                 progress="kit.fabric.progress:FabricProgress", watched=False, trains=False)


def run_kind(config: "RunConfig | Mapping[str, Any]") -> RunKind:
    """The kind of a resolved config, or of a bundle manifest's ``config`` (a dict, as any kit
    version wrote it): fabric when its workload's ``family`` is ``fabric``."""
    if isinstance(config, Mapping):
        family = (config.get("workload") or {}).get("family")
    else:
        family = config.workload.family
    return FABRIC if family == "fabric" else TRAINING
