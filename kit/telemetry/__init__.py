"""Telemetry: device and host counters sampled while a run trains.

Layout: :mod:`kit.telemetry.base` is the interface (:class:`TelemetrySource`: what a backend
reads, how it is planned for a run and how it probes the host) and the shared error mapping;
:mod:`kit.bundle.telemetry_fields` the canonical row and its columns; one module or folder per backend
(``host``, ``replay``, ``nvidia/`` with NVML and its throttle reasons, ``amd/`` with AMD SMI
and its quirks); :mod:`kit.telemetry.counters` unwraps every backend's cumulative counters;
:mod:`kit.telemetry.throttle` names the vendor-neutral throttle bits;
:mod:`kit.telemetry.sampler` the process that samples them. Adding a backend is its module and
one line in :data:`SOURCES` (or :func:`register_source` from outside the kit); platforms may
then list it under ``telemetry:``.

Backends are named here by ``"module:Class"`` strings and imported only when used, so
importing ``kit.telemetry`` never loads a vendor library. The sampler resolves names to these
strings in the caller and imports them in its own process.
"""

import importlib

from kit.errors import KitInputError
from kit.telemetry.base import (
    FieldInfo,
    TelemetryError,
    TelemetryNotSupportedError,
    TelemetrySource,
)

__all__ = [
    "RANK_SIDE_SOURCES",
    "SOURCES",
    "FieldInfo",
    "TelemetryError",
    "TelemetryNotSupportedError",
    "TelemetrySource",
    "build_source",
    "known_sources",
    "load_source_class",
    "register_source",
    "source_target",
]

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


def register_source(name: str, cls: type[TelemetrySource]) -> None:
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


def load_source_class(target: str) -> type[TelemetrySource]:
    """Import the class a ``"module:Class"`` string names (the only place backends load)."""
    module, _, qualname = target.partition(":")
    obj = importlib.import_module(module)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    return obj  # type: ignore[return-value]


def build_source(name: str, **kwargs: object) -> TelemetrySource:
    """Build the backend registered under ``name`` with its keyword arguments.

    Raises:
        KitInputError: No backend has that name.
        TelemetryNotSupportedError: The backend cannot run on this host.
    """
    return load_source_class(source_target(name))(**kwargs)
