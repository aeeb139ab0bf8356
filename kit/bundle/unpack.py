"""Unpack a bundle archive from anyone (``charllm-kit bundle unpack``), treating it as hostile.

Every member header is screened before a byte is extracted: only regular files and
directories, all inside ``<bundle_id>/``, no absolute paths, ``..``, links or device files,
within :class:`~kit.bundle.archive.ArchiveLimits` and, together, within the total the index
declares (itself bounded by the archive's size); no single header may be over 16 MiB, nor
follow more than :data:`MAX_EXTENSION_HEADERS` extension headers.
Extraction goes through tarfile's ``data``
filter into a private staging directory beside the target; the bundle is moved into place only
after its hashes match the index and :func:`~kit.bundle.verify.verify_bundle` passes. Nothing
in the archive is executed, and its JSON is parsed strictly (no YAML, no pickles).

An error is blamed on what caused it: a corrupt or unsafe archive names the archive; a
destination that cannot take the bundle (permission denied, read-only, no space left, a file
where a directory must be) names the destination.
"""

import errno
import gzip
import json
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

from pydantic import ValidationError

from kit.bundle.archive import (
    INDEX_MAX_BYTES,
    INDEX_NAME,
    ArchiveIndex,
    ArchiveLimits,
)
from kit.bundle.reader import check_schema_version
from kit.bundle.verify import verify_bundle
from kit.bundle.writer import SUMS_NAME, file_sha256
from kit.config.loader import describe_validation_error
from kit.errors import BundleError

_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")
# tarfile's "data" filter (PEP 706) exists from Python 3.12 and in 3.10.12 / 3.11.4 updates.
_DATA_FILTER: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


_WRITE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC,
                           errno.EDQUOT, errno.EFBIG, errno.ENOTDIR, errno.EEXIST})
"""Errors only writing can raise: once the archive is open, reading it raises none of them."""

_MAX_READ = 16 * 2**20
"""Largest single read tarfile may make: it reads a pax or GNU long-name header whole."""


MAX_EXTENSION_HEADERS = 8
"""Most extension headers (pax ``x``/``g``, GNU ``L``/``K``) in a row before a member: the
kit's packer writes at most one; a longer chain is refused."""


class _HeaderTooLarge(Exception):
    """tarfile asked to read a header larger than :data:`_MAX_READ` in one go."""


class _HeaderChain(Exception):
    """More than :data:`MAX_EXTENSION_HEADERS` extension headers in a row."""


class _ChainCappedInfo(tarfile.TarInfo):
    """A tar header read with its chain of extension headers cut at
    :data:`MAX_EXTENSION_HEADERS`.

    tarfile reads the header that follows an extension header by calling ``fromtarfile``
    again, one Python frame per link: 2,000 chained headers (8.7 KB of archive) ended
    ``unpack`` in a ``RecursionError``. Counting the frames on the open archive stops the
    chain at a small, fixed depth.
    """

    @classmethod
    def fromtarfile(cls, tarfile: tarfile.TarFile) -> tarfile.TarInfo:
        depth = getattr(tarfile, "_kit_header_depth", 0)
        if depth > MAX_EXTENSION_HEADERS:
            raise _HeaderChain()
        tarfile._kit_header_depth = depth + 1  # type: ignore[attr-defined]
        try:
            return super().fromtarfile(tarfile)
        finally:
            tarfile._kit_header_depth = depth  # type: ignore[attr-defined]


class _CappedReads:
    """The decompressed stream, refusing any one read over :data:`_MAX_READ` bytes.

    tarfile reads member data in small chunks but reads a pax (``x``/``g``) or GNU long-name
    header in a single call of the size the header declares, so a few megabytes of gzip
    could otherwise make it allocate gigabytes before any member is screened.
    """

    def __init__(self, stream: gzip.GzipFile) -> None:
        self._stream = stream

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > _MAX_READ:
            raise _HeaderTooLarge(size)
        return self._stream.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()


def _refuse(archive: Path, why: str) -> NoReturn:
    raise BundleError(f"{archive}: {why}; not unpacked")


@contextmanager
def _writing_into(dest: Path) -> Iterator[None]:
    """Turn an error that only writing can cause into one naming ``dest``, not the archive."""
    try:
        yield
    except OSError as e:
        if e.errno not in _WRITE_ERRNOS:
            raise
        raise BundleError(f"cannot unpack into {dest}: {e.strerror}; not unpacked (pass -o a "
                          "directory you can write, with room for the bundle)") from None


def _kind(member: tarfile.TarInfo) -> str | None:
    """Name what a member is when it is not a regular file or a directory."""
    if member.issym():
        return "a symlink"
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device file"
    if member.isfifo():
        return "a fifo"
    if not (member.isreg() or member.isdir()):
        return "not a regular file or directory"
    return None


def _member_problem(member: tarfile.TarInfo, bundle_id: str, limits: ArchiveLimits) -> str | None:
    """Say why one member may not be extracted, or return None."""
    kind = _kind(member)
    if kind:
        return kind
    path = PurePosixPath(member.name)
    if path.is_absolute():
        return "an absolute path"
    if ".." in path.parts:
        return "a path that leaves the target (..)"
    if _UNSAFE_CHARS.search(member.name) or not path.parts or path.parts[0] != bundle_id:
        return f"a path outside {bundle_id}/"
    if member.size > limits.max_member_bytes:
        return f"{member.size} bytes, over the {limits.max_member_bytes}-byte limit per file"
    return None


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _read_index(tar: tarfile.TarFile, archive: Path) -> ArchiveIndex:
    """Read and check the first member, :data:`INDEX_NAME`."""
    first = tar.next()
    if first is None or first.name != INDEX_NAME or not first.isreg():
        _refuse(archive, f"not a bundle archive (its first member is not {INDEX_NAME})")
    if first.size > INDEX_MAX_BYTES:
        _refuse(archive, f"{INDEX_NAME} is {first.size} bytes, over {INDEX_MAX_BYTES}")
    stream = tar.extractfile(first)
    assert stream is not None  # a regular file always has a stream
    try:
        data = json.loads(stream.read().decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:
        _refuse(archive, f"{INDEX_NAME} is not valid JSON ({e})")
    if not isinstance(data, dict):
        _refuse(archive, f"{INDEX_NAME} is not a JSON object")
    check_schema_version(archive, data.get("schema_version"))
    try:
        return ArchiveIndex.model_validate(data)
    except ValidationError as e:
        _refuse(archive, f"{INDEX_NAME} is invalid: {describe_validation_error(e)}")


def _total_limit(index: ArchiveIndex, archive: Path, limits: ArchiveLimits) -> tuple[int, str]:
    """The most the members may add up to, and what sets it: the index's declared total,
    refused when over what an archive of this size may unpack to."""
    allowed = limits.total_allowed(archive.stat().st_size)
    if index.total_bytes is None:
        return allowed, f"the {allowed}-byte limit for an archive of its size"
    if index.total_bytes > allowed:
        _refuse(archive, f"{INDEX_NAME} declares {index.total_bytes} bytes, over the "
                f"{allowed} bytes an archive of {archive.stat().st_size} bytes may unpack to")
    return index.total_bytes, f"the {index.total_bytes} bytes {INDEX_NAME} declares"


def _screen(
    tar: tarfile.TarFile, archive: Path, limits: ArchiveLimits
) -> tuple[ArchiveIndex, list[tarfile.TarInfo]]:
    """Read every member header, refusing the archive at the first unsafe one."""
    index = _read_index(tar, archive)
    limit, limit_text = _total_limit(index, archive, limits)
    members: list[tarfile.TarInfo] = []
    names: set[str] = set()
    total = 0
    while (member := tar.next()) is not None:
        if len(members) == limits.max_members:
            _refuse(archive, f"more than {limits.max_members} members")
        problem = _member_problem(member, index.bundle_id, limits)
        if problem:
            _refuse(archive, f"member {member.name!r} is {problem}")
        name = member.name.rstrip("/")
        if name in names:
            _refuse(archive, f"member {member.name!r} appears twice")
        names.add(name)
        total += member.size
        if total > limit:
            _refuse(archive, f"members add up to over {limit_text}")
        members.append(member)
    return index, members


def _check_pinned(bundle: Path, index: ArchiveIndex, archive: Path) -> None:
    """Refuse a bundle whose manifest or SHA256SUMS differ from what the index pinned."""
    for name, digest in (("manifest.json", index.manifest_sha256), (SUMS_NAME, index.sums_sha256)):
        if not (bundle / name).is_file():
            _refuse(archive, f"the bundle has no {name}")
        if file_sha256(bundle / name) != digest:
            _refuse(archive, f"{name} does not match the hash in {INDEX_NAME}")
    if index.total_bytes is not None:
        files = [p for p in bundle.rglob("*") if p.is_file()]
        total = sum(p.stat().st_size for p in files)
        if total != index.total_bytes:
            _refuse(archive, f"its files add up to {total} bytes, not the {index.total_bytes} "
                    f"{INDEX_NAME} declares")


def _extract(tar: tarfile.TarFile, members: list[tarfile.TarInfo], index: ArchiveIndex,
             archive: Path, dest: Path) -> None:
    """Extract screened members into a staging directory, check them, move the bundle in.

    On any failure the staging directory, and ``dest`` when this created it, are removed.
    """
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{index.bundle_id}.unpack-", dir=dest))
    try:
        tar.extractall(staging, members=members, **_DATA_FILTER)
        bundle = staging / index.bundle_id
        _check_pinned(bundle, index, archive)
        try:
            verify_bundle(bundle)
        except BundleError as e:  # named by the archive: the staging folder is gone by now
            why = str(e).replace(f"bundle {bundle}: ", "").replace(str(bundle), index.bundle_id)
            _refuse(archive, f"bundle {index.bundle_id} fails verification: {why}")
        os.rename(bundle, dest / index.bundle_id)
        created = False
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            dest.rmdir()


def unpack_bundle(
    archive: str | Path, dest: str | Path = ".", limits: ArchiveLimits | None = None
) -> Path:
    """Unpack and verify one bundle archive into ``dest/<bundle_id>/``.

    Args:
        archive: A ``.tar.gz`` written by :func:`kit.bundle.pack.pack_bundle`.
        dest: Directory that receives the bundle; created when missing.
        limits: Size and count limits; :class:`ArchiveLimits` defaults when None.

    Returns:
        The unpacked, verified bundle directory.

    Raises:
        BundleError: An unreadable or unsafe archive, a bundle of a newer schema, a bundle
            that fails verification, a target directory that already exists, or a ``dest``
            that cannot take the bundle (named, with the reason). Nothing is left under
            ``dest`` then, and ``dest`` is removed again if this call created it.
    """
    archive, dest = Path(archive), Path(dest)
    limits = limits or ArchiveLimits()
    if not archive.is_file():
        raise BundleError(f"no archive at {archive}")
    try:
        with gzip.open(archive, "rb") as gz, tarfile.open(
            fileobj=_CappedReads(gz), mode="r:",  # type: ignore[arg-type]  # read/seek/tell
            tarinfo=_ChainCappedInfo,
        ) as tar:
            index, members = _screen(tar, archive, limits)
            target = dest / index.bundle_id
            if target.exists():
                raise BundleError(f"{target} already exists: remove it or pass another -o")
            with _writing_into(dest):
                _extract(tar, members, index, archive, dest)
    except _HeaderTooLarge:
        _refuse(archive, f"a member header is over {_MAX_READ} bytes")
    except _HeaderChain:
        _refuse(archive, f"a member has over {MAX_EXTENSION_HEADERS} extension headers (pax or "
                "GNU long-name) in a row")
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as e:
        _refuse(archive, f"not a readable .tar.gz ({type(e).__name__}: {e})")
    except OSError as e:  # the archive itself: unreadable file, I/O error
        _refuse(archive, f"cannot be read ({e.strerror or e})")
    return target
