"""Split one rank's step time into forward, backward, pipeline p2p, grad sync and optimizer.

megatron-core's schedules, p2p layer and ``finalize_model_grads`` already time these phases
when ``config.timers`` holds a :class:`megatron.core.timers.Timers`. Its timers synchronize
the device at every start and stop, so on GPUs they would change the step time they measure;
the engine installs them only on the CPU platform, where that synchronization is a no-op.
Communication on gloo is blocking, so pipeline p2p and grad sync times are exposed time.
"""

import time
from collections.abc import Callable
from typing import Any

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
PHASES: dict[str, tuple[str, ...]] = {
    "forward_s": _FORWARD,
    "backward_s": _BACKWARD,
    "pipeline_p2p_s": _PIPELINE_P2P,
    "grad_sync_s": _GRAD_SYNC,
}
"""Kit phase -> the megatron-core timer names summed into it."""


class PhaseTimers:
    """megatron-core's timers on one rank's config, read out per step."""

    def __init__(self, config: Any) -> None:
        from megatron.core.timers import Timers

        self._timers = Timers(log_level=2, log_option="minmax")
        config.timers = self._timers
        config.barrier_with_L1_time = False  # time what the rank does, add no barrier
        self._optimizer_s = 0.0

    def time_optimizer(self, step: Callable[[], Any]) -> Any:
        """Run the optimizer step and time it."""
        t0 = time.perf_counter()
        out = step()
        self._optimizer_s = time.perf_counter() - t0
        return out

    def read(self) -> dict[str, float]:
        """Seconds per phase since the last read (and reset the timers)."""
        # grad sync timers are megatron's level 1, the others level 2; a timer must be looked
        # up with the level megatron-core creates it with
        out = {
            phase: sum(
                self._timers(name, log_level=1 if phase == "grad_sync_s" else 2)
                .elapsed(reset=True) for name in names
            )
            for phase, names in PHASES.items()
        }
        out["optimizer_s"] = self._optimizer_s
        return out
