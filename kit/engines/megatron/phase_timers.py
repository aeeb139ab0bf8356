"""Split one rank's step time into forward, backward, pipeline p2p, grad sync and optimizer.

megatron-core's schedules, p2p layer and ``finalize_model_grads`` already time these phases
through ``config.timers``. On the CPU platform that is megatron-core's own
:class:`megatron.core.timers.Timers` (its device synchronization is a no-op there, and gloo
communication is blocking, so p2p and grad sync times are exposed time). On GPUs megatron's
timers would synchronize the device at every start and stop and change the step they measure,
so :class:`CudaEventTimers` stands in: each start and stop records a CUDA event on the current
stream and nothing waits until the step is over. A phase is then the stream time between its
events: compute for forward and backward, and for p2p and grad sync the time the compute
stream waited on communication, i.e. exposed communication. A step replayed from a CUDA graph
(:mod:`kit.engines.megatron.step_graph`) runs no Python timers; the engine skips phases there.
"""

from collections.abc import Callable
from typing import Any

import torch

_FORWARD = ("forward-compute",)
_BACKWARD = ("backward-compute",)
_PIPELINE_P2P = (
    "forward-recv", "forward-send", "backward-recv", "backward-send",
    "forward-send-backward-recv", "backward-send-forward-recv", "forward-send-forward-recv",
    "backward-send-backward-recv", "forward-backward-send-forward-backward-recv",
)
_GRAD_SYNC = (
    "all-grads-sync", "embedding-grads-all-reduce", "non-tensor-parallel-grads-all-reduce",
    "conditional-embedder-grads-all-reduce",
)
_OPTIMIZER = ("kit-optimizer-step",)
PHASES: dict[str, tuple[str, ...]] = {
    "forward_s": _FORWARD,
    "backward_s": _BACKWARD,
    "pipeline_p2p_s": _PIPELINE_P2P,
    "grad_sync_s": _GRAD_SYNC,
    "optimizer_s": _OPTIMIZER,
}
"""Kit phase -> the timer names summed into it (megatron-core's, and the engine's optimizer)."""


class _EventTimer:
    """One named timer: pairs of CUDA events, summed when read."""

    def __init__(self) -> None:
        self._spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._start: torch.cuda.Event | None = None

    def start(self, barrier: bool = False) -> None:
        """Record the start on the current stream (``barrier`` is megatron's; not used)."""
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def stop(self, barrier: bool = False) -> None:
        """Record the end on the current stream."""
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        if self._start is not None:
            self._spans.append((self._start, end))
        self._start = None

    def elapsed(self, reset: bool = True, barrier: bool = False) -> float:
        """Seconds between each start and its stop, summed; waits for the last stop."""
        if self._spans:
            self._spans[-1][1].synchronize()
        seconds = sum(start.elapsed_time(end) for start, end in self._spans) / 1e3
        if reset:
            self._spans = []
        return seconds


class CudaEventTimers:
    """What megatron-core calls as ``config.timers(name, log_level=...)``, on CUDA events."""

    def __init__(self) -> None:
        self._timers: dict[str, _EventTimer] = {}

    def __call__(self, name: str, log_level: int | None = None,
                 barrier: bool = False) -> _EventTimer:
        """The timer called ``name`` (created on first use)."""
        return self._timers.setdefault(name, _EventTimer())


class PhaseTimers:
    """Per-phase timers installed on one rank's megatron config, read out per step."""

    def __init__(self, config: Any, cuda: bool) -> None:
        if cuda:
            self._timers: Any = CudaEventTimers()
        else:
            from megatron.core.timers import Timers

            self._timers = Timers(log_level=2, log_option="minmax")
        config.timers = self._timers
        config.barrier_with_L1_time = False  # time what the rank does, add no barrier

    def _timer(self, phase: str, name: str) -> Any:
        # megatron's grad sync timers are its level 1, the others level 2; its Timers must be
        # asked with the level megatron-core creates a timer with
        return self._timers(name, log_level=1 if phase == "grad_sync_s" else 2)

    def time_optimizer(self, step: Callable[[], Any]) -> Any:
        """Run the optimizer step between the ``optimizer_s`` timer's start and stop."""
        timer = self._timer("optimizer_s", _OPTIMIZER[0])
        timer.start()
        out = step()
        timer.stop()
        return out

    def read(self) -> dict[str, float]:
        """Seconds per phase since the last read (and reset the timers)."""
        return {
            phase: sum(self._timer(phase, name).elapsed(reset=True) for name in names)
            for phase, names in PHASES.items()
        }
