"""Verify a bundle end to end: checksums, file list, JSON models and parquet schemas."""

import re
from pathlib import Path, PurePosixPath

from kit.bundle.reader import bundle_dir, check_parquet, read_bundle, read_schema_version
from kit.bundle.schema import STEPS_SCHEMA, TELEMETRY_SCHEMA
from kit.bundle.writer import SUMS_NAME, bundle_files, file_sha256
from kit.errors import BundleError

_SUMS_LINE = re.compile(r"([0-9a-f]{64})  (.+)")


def _read_sums(root: Path) -> dict[str, str]:
    """Parse ``SHA256SUMS`` into relative path -> hex digest, refusing anything odd."""
    path = root / SUMS_NAME
    if not path.is_file():
        raise BundleError(f"bundle {root}: {SUMS_NAME} is missing")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BundleError(f"bundle {root}: {SUMS_NAME} is not UTF-8 text") from None
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = _SUMS_LINE.fullmatch(line)
        if not match:
            raise BundleError(f"bundle {root}: {SUMS_NAME} line {number} is malformed")
        digest, rel = match.groups()
        listed = PurePosixPath(rel)
        if listed.is_absolute() or ".." in listed.parts or rel in sums or rel == SUMS_NAME:
            raise BundleError(f"bundle {root}: {SUMS_NAME} line {number} lists {rel!r} wrongly")
        sums[rel] = digest
    return sums


def verify_bundle(path: str | Path) -> list[str]:
    """Check that a bundle is complete, untouched and readable by this kit.

    Args:
        path: The bundle directory.

    Returns:
        The files whose checksums matched, as sorted relative paths.

    Raises:
        BundleError: The first problem found, in one line naming the file: missing
            ``SHA256SUMS``, a listed file missing, a checksum mismatch, an unlisted file, JSON
            that fails its model (or is newer than this kit), a parquet file of another schema.
    """
    root = bundle_dir(path)
    read_schema_version(root)  # a newer layout is named as such, not as a broken file
    sums = _read_sums(root)
    present = set(bundle_files(root))
    for rel, digest in sorted(sums.items()):
        if rel not in present:
            raise BundleError(f"bundle {root}: missing file {rel}")
        if file_sha256(root / rel) != digest:
            raise BundleError(f"bundle {root}: checksum mismatch: {rel}")
    unlisted = sorted(present - set(sums))
    if unlisted:
        raise BundleError(f"bundle {root}: unlisted file: {unlisted[0]}")
    read_bundle(root)
    check_parquet(root, "steps.parquet", STEPS_SCHEMA)
    check_parquet(root, "telemetry.parquet", TELEMETRY_SCHEMA)
    return sorted(sums)
