"""The small interface every training engine implements, and what one step reports."""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from kit.config.run import RunConfig


def rank_device(cpu: bool, local_rank: int) -> torch.device:
    """The device a rank computes on: the host, or its node-local GPU (made current)."""
    if cpu:
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank sits in the parallel layout (filled in by the engine after setup)."""

    rank: int
    local_rank: int
    node: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    cp_rank: int = 0
    ep_rank: int = 0


@dataclass
class StepResult:
    """What one optimizer step produced on one rank."""

    loss: float | None
    """Mean training loss of the step on this rank (null on ranks that compute none)."""
    tokens: int
    """Tokens this rank's data-parallel replica consumed in the step."""
    phases: dict[str, float] | None = None
    """Seconds of the step by phase (forward, backward, pipeline p2p, grad sync, optimizer)
    where the engine can time them without changing the step; null elsewhere."""
    expert_tokens: dict[str, list[int]] | None = None
    """Tokens this rank routed to each expert in the step (all micro-batches), by MoE layer
    number (1-based, global, as a string): one count per expert; null for dense models and
    engines that do not count."""


@dataclass
class EngineInfo:
    """Versions and choices an engine reports for the manifest."""

    versions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Engine(ABC):
    """A training back end: builds the model for one rank and runs optimizer steps."""

    name: str
    device: torch.device
    """The device this rank computes on (set by ``setup``)."""

    @abstractmethod
    def import_framework(self, cpu: bool) -> None:
        """Import the training framework (what a rank imports before ``engine_imported``).

        The worker calls it before :meth:`setup`, which calls it again (then a no-op) for
        callers that start with ``setup``.
        """

    @abstractmethod
    def setup(self, cfg: RunConfig, rank: int, local_rank: int, world_size: int) -> RankPlacement:
        """Initialize process groups, model, optimizer and data for this rank.

        The default process group may exist already (the worker creates it while the engine
        imports, :mod:`kit.launch.early_groups`); then the engine keeps it.
        """

    @abstractmethod
    def train_step(self, step: int) -> StepResult:
        """Run one optimizer step (all its micro-batches); return when this rank is done."""

    def synchronize(self) -> None:
        """Wait for this rank's device work to finish (a no-op on CPU).

        Through the device's own torch module (``torch.cuda`` on NVIDIA and ROCm, ``torch.xpu``,
        ``torch.hpu`` ...), so an engine on another accelerator needs no change here.
        """
        if self.device.type != "cpu":
            torch.get_device_module(self.device).synchronize(self.device)

    def peak_memory_bytes(self) -> int | None:
        """Peak device memory allocated by this rank so far (CPU: the process's peak RSS)."""
        if self.device.type != "cpu":
            return int(torch.get_device_module(self.device).max_memory_allocated(self.device))
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    @abstractmethod
    def info(self) -> EngineInfo:
        """Versions and notes for the manifest."""

    def quiesce(self) -> None:
        """Finish whatever the engine still runs in the background after the last step (e.g.
        prefetches), so that the rank may exit without :meth:`teardown`."""

    @abstractmethod
    def teardown(self) -> None:
        """Release process groups and device memory."""
