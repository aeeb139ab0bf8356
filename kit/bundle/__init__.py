"""Result bundles: the one self-describing directory every run leaves behind.

- :mod:`kit.bundle.schema`: the v1 layout: manifest and metrics models, parquet schemas.
- :mod:`kit.bundle.writer`: stage a bundle while a run goes, publish it atomically.
- :mod:`kit.bundle.reader`: open a finished bundle, refusing unknown or broken ones.
- :mod:`kit.bundle.verify`: check checksums, file list and schemas end to end.
- :mod:`kit.bundle.verified`: read a bundle for analysis or export only if it verifies.
- :mod:`kit.bundle.show`: a short human summary.
- :mod:`kit.bundle.json_schema`: the published JSON Schemas (``schemas/*.schema.json``).
- :mod:`kit.bundle.archive`, :mod:`kit.bundle.pack`, :mod:`kit.bundle.unpack`: one ``.tar.gz``
  per bundle, unpacked as untrusted input; :mod:`kit.bundle.redact` strips hosts, users, IPs.

Every broken, tampered or too-new bundle raises :class:`kit.errors.BundleError` with one line
naming the offending file.
"""

from kit.bundle.pack import pack_bundle
from kit.bundle.reader import Bundle, read_bundle
from kit.bundle.redact import redact_bundle
from kit.bundle.schema import (
    SCHEMA_VERSION,
    STATUSES,
    STEPS_SCHEMA,
    SUMMARY_KEYS,
    FieldSource,
    Manifest,
    MetricsFile,
    NodeInventory,
    RankRecord,
)
from kit.bundle.show import format_bundle
from kit.bundle.unpack import unpack_bundle
from kit.bundle.verify import verify_bundle
from kit.bundle.writer import BundleStaging, concat_chunks, new_bundle_id
from kit.telemetry.fields import TELEMETRY_FIELDS, TELEMETRY_SCHEMA, THROTTLE_BITS

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
    "format_bundle",
    "new_bundle_id",
    "pack_bundle",
    "read_bundle",
    "redact_bundle",
    "unpack_bundle",
    "verify_bundle",
]
