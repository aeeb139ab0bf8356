"""The telemetry backends a platform may name, and where each one's class lives.

A platform file lists backends by name under ``telemetry:``; this registry says which names
exist and which ``"module:Class"`` implements each (:mod:`kit.telemetry` has the backends
themselves). It holds strings, not classes, so validating a platform, or starting the sampler
in a fresh process, imports no vendor library; a class is imported only by
:func:`load_source_class`.
"""

from typing import TYPE_CHECKING

from kit.config.targets import import_target
from kit.errors import KitInputError

if TYPE_CHECKING:
    from kit.telemetry.base import TelemetrySource

SOURCES: dict[str, str] = {
    "amdsmi": "kit.telemetry.amd.amdsmi:AmdSmiSource",
    "host": "kit.telemetry.host:HostSource",
    "nvml": "kit.telemetry.nvidia.nvml:NvmlSource",
    "replay": "kit.telemetry.replay:ReplaySource",
}
"""Backend name -> ``"module:Class"`` of its :class:`TelemetrySource` subclass."""

RANK_SIDE_SOURCES: tuple[str, ...] = ("zeus",)
"""Names a platform's ``telemetry`` may list that are measured inside the ranks, not by the
sampler (Zeus energy windows per step: kit.telemetry.zeus)."""


def known_sources() -> list[str]:
    """Every name a platform's ``telemetry`` list may use."""
    return sorted([*SOURCES, *RANK_SIDE_SOURCES])


def register_source(name: str, cls: "type[TelemetrySource]") -> None:
    """Add a backend under ``name`` (e.g. one defined outside the kit, or in a test).

    The class must be importable by its module and qualified name, because the sampler builds
    it in a separate (spawned) process. Registering the same class again is a no-op, so a
    module that registers at import time may be imported twice.

    Raises:
        KitInputError: ``name`` is taken by another class, or ``cls`` is defined inside a
            function.
    """
    if "<locals>" in cls.__qualname__:
        raise KitInputError(
            f"{cls.__qualname__} is defined inside a function; define it at module level "
            "so the sampler process can import it"
        )
    target = f"{cls.__module__}:{cls.__qualname__}"
    if SOURCES.setdefault(name, target) != target:
        raise KitInputError(f"telemetry source {name!r} is already registered ({SOURCES[name]})")


def source_target(name: str) -> str:
    """Return the ``"module:Class"`` string registered under ``name``.

    Raises:
        KitInputError: No backend has that name.
    """
    try:
        return SOURCES[name]
    except KeyError:
        raise KitInputError(
            f"unknown telemetry source {name!r}; known: {', '.join(sorted(SOURCES))}"
        ) from None


def load_source_class(target: str) -> "type[TelemetrySource]":
    """Import the class a ``"module:Class"`` string names (the only place backends load)."""
    cls: type[TelemetrySource] = import_target(target)
    return cls
