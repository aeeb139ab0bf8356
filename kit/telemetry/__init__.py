"""Telemetry: device and host counters sampled while a run trains.

Layout: :mod:`kit.telemetry.base` is the interface (:class:`TelemetrySource`: what a backend
reads, how it is planned for a run and how it probes the host) and the shared error mapping;
:mod:`kit.bundle.telemetry_fields` the canonical row and its columns (part of the bundle
format); one module or folder per backend (``host``, ``replay``, ``nvidia/`` with NVML and its
throttle reasons, ``amd/`` with AMD SMI and its quirks); :mod:`kit.telemetry.counters` unwraps
every backend's cumulative counters; :mod:`kit.telemetry.throttle` names the vendor-neutral
throttle bits; :mod:`kit.telemetry.sampler` the process that samples them. Adding a backend is
its module and one line in :data:`SOURCES` (kit/config/telemetry_sources.py, re-exported here;
or :func:`register_source` from outside the kit);
platforms may then list it under ``telemetry:``.

Backends are named here by ``"module:Class"`` strings and imported only when used, so
importing ``kit.telemetry`` never loads a vendor library. The sampler resolves names to these
strings in the caller and imports them in its own process.
"""


from kit.config.telemetry_sources import (
    RANK_SIDE_SOURCES,
    SOURCES,
    known_sources,
    load_source_class,
    register_source,
    source_target,
)
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

def build_source(name: str, **kwargs: object) -> TelemetrySource:
    """Build the backend registered under ``name`` with its keyword arguments.

    Raises:
        KitInputError: No backend has that name.
        TelemetryNotSupportedError: The backend cannot run on this host.
    """
    return load_source_class(source_target(name))(**kwargs)
