"""The bundle archive (``bundle pack`` / ``bundle unpack``): its index member and size limits.

An archive is one gzip-compressed POSIX (pax) tar file whose first member is
:data:`INDEX_NAME`, an :class:`ArchiveIndex`, followed by the bundle directory ``<bundle_id>/``
and nothing else. The index pins the bundle's ``manifest.json`` and ``SHA256SUMS`` by SHA-256,
and ``SHA256SUMS`` pins every other file, so an unpacked bundle is exactly the packed one.
The index also declares the files' total size; ``unpack`` refuses an archive whose member
headers add up to more before it writes a byte, and a bundle whose checksummed files do not
add up to exactly it.
"""

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

INDEX_NAME = "bundle-archive.json"
"""First member of every archive."""

INDEX_MAX_BYTES = 64 * 1024
"""An index larger than this is refused unread."""

BUNDLE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]*$"
"""What a bundle directory name may be (see kit.bundle.writer.new_bundle_id)."""

_SHA256 = r"^[0-9a-f]{64}$"


class ArchiveIndex(BaseModel):
    """``bundle-archive.json``: which bundle the archive holds and the hashes that pin it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bundle_id: str = Field(pattern=BUNDLE_ID_PATTERN, description="The bundle directory name.")
    schema_version: int = Field(ge=1, description="The bundle's manifest schema_version.")
    manifest_sha256: str = Field(pattern=_SHA256, description="SHA-256 of manifest.json, hex.")
    sums_sha256: str = Field(pattern=_SHA256, description="SHA-256 of SHA256SUMS, hex.")
    redacted: bool = Field(description="Packed with --redact (see the manifest's redaction).")
    total_bytes: int | None = Field(
        None, ge=0, description="Sum of the bundle's file sizes, bytes; null in archives of "
        "kits before 2026-11-27 (then ArchiveLimits alone bound the unpack).")


@dataclass(frozen=True)
class ArchiveLimits:
    """How much an archive may hold before ``unpack`` refuses it without extracting anything.

    The defaults leave room for a 1024-rank run's logs and hours of 20 ms telemetry on a
    large node count; a bundle beyond them is not one the kit wrote.
    """

    max_members: int = 20_000
    """Members after the index: files and directories."""
    max_member_bytes: int = 8 * 2**30
    """Size of any one file."""
    max_total_bytes: int = 32 * 2**30
    """Sum of all file sizes."""
    max_expansion: int = 100
    """Most bytes unpacked per byte of archive, beyond :attr:`free_bytes`: a bundle is mostly
    parquet, which gzip barely shrinks, while a crafted member of zeros shrinks a
    thousandfold (an 8 MB archive would fill 8 GiB)."""
    free_bytes: int = 256 * 2**20
    """Unpacked size allowed whatever the archive's size."""

    def total_allowed(self, archive_bytes: int) -> int:
        """The most an archive of ``archive_bytes`` may unpack to."""
        return min(self.max_total_bytes, self.free_bytes + self.max_expansion * archive_bytes)
