"""How a run's training step executes: replayed from one captured CUDA graph, or eager.

A graphed step replays the GPU's work with no Python between kernels; an eager one is launched
kernel by kernel from Python, and on a fast GPU the host can be what paces it (gpt3-2.7b with
full recomputation ran at 0.259 MFU eager against 0.463 graphed without it, one H100). Power,
throughput and every finding built on them differ between the two for reasons that are not the
layout's, so the mode is part of a run's description: the engine's spec states it before any
rank starts (``run --dry-run``, the launcher's progress line) and the bundle records it in
``metrics.json`` ``execution``. Bundles written before that field carry it only in two notes of
the megatron engine, which :func:`execution_of` reads too.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

GRAPHED: Literal["graphed"] = "graphed"
EAGER: Literal["eager"] = "eager"

_FEATURES_NOTE = "speed features:"
_EAGER_NOTE = "cuda_graph off:"
_EAGER_NOTE_END = " keep(s) the eager step"


@dataclass(frozen=True)
class Execution:
    """A step's execution mode, and why it is eager when it is.

    Attributes:
        mode: ``graphed`` (the forward and backward of each step replayed from one CUDA graph)
            or ``eager``.
        eager_because: What keeps the step eager, one short phrase each (empty when graphed).
    """

    mode: Literal["graphed", "eager"]
    eager_because: tuple[str, ...] = ()

    @property
    def graphed(self) -> bool:
        """Whether the step is replayed from a CUDA graph."""
        return self.mode == GRAPHED

    def as_json(self) -> dict[str, Any]:
        """The ``metrics.json`` ``execution`` object."""
        return {"mode": self.mode, "eager_because": list(self.eager_because)}

    def describe(self) -> str:
        """One phrase for a progress line or a table: ``graphed`` or ``eager (why)``."""
        if self.graphed or not self.eager_because:
            return self.mode
        return f"eager ({'; '.join(self.eager_because)})"

    def note(self) -> str:
        """The megatron engine's note for an eager step that could have been graphed (the
        form bundles have carried since before the ``execution`` field)."""
        return f"{_EAGER_NOTE} {', '.join(self.eager_because)}{_EAGER_NOTE_END}"


def execution_of(execution: Mapping[str, Any] | None, notes: Sequence[str]) -> Execution | None:
    """The execution a bundle records: its ``execution`` object, else what its notes say.

    Before the field, the megatron engine wrote ``speed features: ...`` listing ``cuda_graph``
    when the feature was on, and ``cuda_graph off: <blockers> keep(s) the eager step`` when the
    layout kept the step eager; a bundle of another engine, or one whose features note lacks
    ``cuda_graph``, ran eager. None when neither the field nor a features note is there (the
    mode cannot be told).
    """
    if execution and execution.get("mode") in (GRAPHED, EAGER):
        return Execution(execution["mode"], tuple(execution.get("eager_because") or ()))
    features = next((n for n in notes if n.startswith(_FEATURES_NOTE)), None)
    if features is None:
        return None
    blocked = next((n for n in notes if n.startswith(_EAGER_NOTE)), None)
    if blocked is not None:
        why = blocked[len(_EAGER_NOTE):].removesuffix(_EAGER_NOTE_END).strip()
        return Execution(EAGER, tuple(w.strip() for w in why.split(",") if w.strip()))
    listed = {f.strip() for f in features[len(_FEATURES_NOTE):].split(",")}
    if "cuda_graph" in listed:
        return Execution(GRAPHED)
    return Execution(EAGER, ("cuda_graph not among the speed features",))
