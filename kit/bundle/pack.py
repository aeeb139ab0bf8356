"""Pack a verified bundle into one reproducible ``.tar.gz`` (``charllm-kit bundle pack``)."""

import gzip
import io
import json
import os
import re
import tarfile
import tempfile
from datetime import datetime
from pathlib import Path, PurePosixPath

from kit.bundle.archive import BUNDLE_ID_PATTERN, INDEX_NAME, ArchiveIndex
from kit.bundle.reader import bundle_dir, read_bundle
from kit.bundle.redact import redact_bundle
from kit.bundle.verify import verify_bundle
from kit.bundle.writer import SUMS_NAME, bundle_files, file_sha256
from kit.errors import KitInputError


def _tarinfo(name: str, mtime: int, size: int | None) -> tarfile.TarInfo:
    """A member with no owner, group or host detail: a directory when ``size`` is None."""
    info = tarfile.TarInfo(name)
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if size is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.size = size
        info.mode = 0o644
    return info


def _write_archive(root: Path, dest: Path) -> None:
    """Write ``root``, a bundle already verified, as an archive at ``dest``, atomically.

    Members are sorted and carry the manifest's creation time and no owner, so packing the
    same bundle twice gives the same bytes.
    """
    bundle = read_bundle(root)
    files = bundle_files(root) + [SUMS_NAME]
    index = ArchiveIndex(
        bundle_id=root.name,
        schema_version=bundle.manifest.schema_version,
        manifest_sha256=file_sha256(root / "manifest.json"),
        sums_sha256=file_sha256(root / SUMS_NAME),
        redacted=bundle.manifest.redaction is not None,
        total_bytes=sum((root / rel).stat().st_size for rel in files),
    )
    created = bundle.manifest.created_utc.replace("Z", "+00:00")
    mtime = int(datetime.fromisoformat(created).timestamp())
    dirs = {str(p) for f in files for p in PurePosixPath(f).parents if str(p) != "."}
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    except OSError as e:  # the archive asked for, not the hidden temp file, is what failed
        raise OSError(e.errno, e.strerror, str(dest)) from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                data = json.dumps(index.model_dump(mode="json"), indent=2).encode() + b"\n"
                tar.addfile(_tarinfo(INDEX_NAME, mtime, len(data)), io.BytesIO(data))
                tar.addfile(_tarinfo(root.name, mtime, None))
                for rel in sorted(dirs | set(files)):
                    name = f"{root.name}/{rel}"
                    if rel in dirs:
                        tar.addfile(_tarinfo(name, mtime, None))
                        continue
                    path = root / rel
                    with path.open("rb") as f:
                        tar.addfile(_tarinfo(name, mtime, path.stat().st_size), f)
        os.chmod(tmp, 0o666 & ~_umask())  # as open() would create it: mkstemp's 0600 would
        os.replace(tmp, dest)              # keep colleagues from the archive meant for them
    except OSError as e:  # e.g. no space left while writing: say which archive
        raise OSError(e.errno, e.strerror, str(dest)) from None
    finally:
        tmp.unlink(missing_ok=True)


def _umask() -> int:
    """This process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def pack_bundle(path: str | Path, out: str | Path | None = None, redact: bool = False,
                partitions: bool = False) -> Path:
    """Verify a bundle and pack it into one ``.tar.gz``.

    Args:
        path: The bundle directory.
        out: The archive to write; default ``<bundle_id>.tar.gz`` (``.redacted.tar.gz``
            with ``redact``) in the current directory.
        redact: Pack a copy without secrets, accounts, user names, e-mail addresses, host
            names, IP addresses and device identities (:func:`kit.bundle.redact.redact_bundle`);
            the bundle on disk is left as it is.
        partitions: With ``redact``, also hide Slurm partition names.

    Returns:
        The archive written.

    Raises:
        KitInputError: The bundle does not verify, its directory name is not a bundle id, or
            ``out`` already exists.
    """
    root = bundle_dir(path)
    if not re.fullmatch(BUNDLE_ID_PATTERN, root.name):
        raise KitInputError(f"{root.name!r} is not a bundle id (letters, digits, ._@-): rename it")
    verify_bundle(root)
    suffix = ".redacted.tar.gz" if redact else ".tar.gz"
    dest = Path(out) if out is not None else Path.cwd() / f"{root.name}{suffix}"
    if dest.exists():
        raise KitInputError(f"{dest} already exists: remove it or pass another -o")
    if not dest.parent.is_dir():
        raise KitInputError(f"cannot write {dest}: {dest.parent} is not a directory")
    with tempfile.TemporaryDirectory(prefix="charllm-pack-") as tmp:
        source = redact_bundle(root, Path(tmp), partitions) if redact else root
        _write_archive(source, dest)
    return dest
