"""Result bundles: the one self-describing directory every run leaves behind, as a format.

This package is the format only: what a run writes and how it is read, checked, packed and
redacted. Assembling one at the end of a run (kit.launch.assemble, kit.launch.recover) and
showing one (kit.analysis.show) live with the code that does those.

- :mod:`kit.bundle.schema`: the v1 layout: manifest and metrics models, parquet schemas.
- :mod:`kit.bundle.writer`: stage a bundle while a run goes, publish it atomically.
- :mod:`kit.bundle.reader`: open a finished bundle, refusing unknown or broken ones.
- :mod:`kit.bundle.verify`: check checksums, file list and schemas end to end.
- :mod:`kit.bundle.verified`: read a bundle for analysis or export only if it verifies.
- :mod:`kit.bundle.json_schema`: the published JSON Schemas (``schemas/*.schema.json``).
- :mod:`kit.bundle.archive`, :mod:`kit.bundle.pack`, :mod:`kit.bundle.unpack`: one ``.tar.gz``
  per bundle, unpacked as untrusted input; :mod:`kit.bundle.redact` strips hosts, users, IPs.

Every broken, tampered or too-new bundle raises :class:`kit.errors.BundleError` with one line
naming the offending file.
"""

import importlib
from typing import Any

_HOMES = {
    "pack_bundle": "kit.bundle.pack",
    "Bundle": "kit.bundle.reader",
    "read_bundle": "kit.bundle.reader",
    "redact_bundle": "kit.bundle.redact",
    **dict.fromkeys(("SCHEMA_VERSION", "STATUSES", "STEPS_SCHEMA", "SUMMARY_KEYS", "FieldSource",
                     "Manifest", "MetricsFile", "NodeInventory", "RankRecord"),
                    "kit.bundle.schema"),
    "unpack_bundle": "kit.bundle.unpack",
    "verify_bundle": "kit.bundle.verify",
    **dict.fromkeys(("BundleStaging", "concat_chunks", "new_bundle_id"), "kit.bundle.writer"),
    **dict.fromkeys(("TELEMETRY_FIELDS", "TELEMETRY_SCHEMA", "THROTTLE_BITS"),
                    "kit.bundle.telemetry_fields"),
}
"""Where each name below lives: imported on first use, so a process that needs one module of
the bundle layer (the launcher needs the schema) does not import the readers, packers and
redaction with it (parquet reading, pyarrow.compute: part of every run's start-up)."""


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'kit.bundle' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)


__all__ = [
    "SCHEMA_VERSION",
    "STATUSES",
    "STEPS_SCHEMA",
    "SUMMARY_KEYS",
    "TELEMETRY_FIELDS",
    "TELEMETRY_SCHEMA",
    "THROTTLE_BITS",
    "Bundle",
    "BundleStaging",
    "FieldSource",
    "Manifest",
    "MetricsFile",
    "NodeInventory",
    "RankRecord",
    "concat_chunks",
    "new_bundle_id",
    "pack_bundle",
    "read_bundle",
    "redact_bundle",
    "unpack_bundle",
    "verify_bundle",
]
