"""Checks on where a command is told to write, made before anything is written.

A report, an export or a new bundle written inside an existing bundle would break that bundle's
checksums, and a target whose parent is a file cannot be created: both are bad input, reported
in one line (exit 2) instead of a traceback halfway through the work.
"""

import os
from pathlib import Path

from kit.errors import KitInputError


def _enclosing_bundle(path: Path) -> Path | None:
    """The bundle folder (one holding ``SHA256SUMS``) that ``path`` would land in, if any."""
    from kit.bundle.writer import SUMS_NAME  # pyarrow: only when a command writes

    for folder in [path, *path.parents]:
        if (folder / SUMS_NAME).is_file():
            return folder
    return None


def check_output_dir(path: Path) -> None:
    """Refuse a directory to create (or write into) that cannot be one or lies in a bundle."""
    _check(path.absolute(), path.absolute())


def check_output_file(path: Path) -> None:
    """Refuse a file to write that is a directory, cannot be created or lies in a bundle."""
    target = path.absolute()
    if target.is_dir():
        raise KitInputError(f"cannot write {path}: it is a directory")
    _check(target, target.parent)


def _check(target: Path, folder: Path) -> None:
    bundle = _enclosing_bundle(folder)
    if bundle is not None:
        raise KitInputError(
            f"cannot write {target}: it is inside the bundle {bundle}, whose checksums it would "
            "break; write it outside the bundle"
        )
    for parent in [folder, *folder.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise KitInputError(f"cannot write {target}: {parent} is not a directory")
            why = _unwritable(parent)
            if why:
                raise KitInputError(f"cannot write {target}: {why}")
            return


PSEUDO_FILE_SYSTEMS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs",
                                 "securityfs", "configfs", "tracefs", "pstore", "bpf"})
"""Kernel file systems that take no new folders or files, whatever the permissions say."""


def _unwritable(folder: Path) -> str | None:
    """Why nothing can be created in ``folder`` (checked without creating anything), or None.

    Permissions alone do not tell: root may write anywhere by them, yet not on a read-only mount
    or in /proc, where creating a folder fails with a misleading "No such file or directory".
    """
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable"
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return f"{folder} is on a read-only file system"
    fstype = _file_system(folder)
    if fstype in PSEUDO_FILE_SYSTEMS:
        return (f"no file or folder can be created in {folder} (the kernel's {fstype} file "
                "system)")
    return None


def _file_system(folder: Path) -> str | None:
    """The type of the file system ``folder`` is on (the longest mount point above it)."""
    import psutil

    resolved = folder.resolve()
    above = [(len(mount.parts), part.fstype) for part in psutil.disk_partitions(all=True)
             if (mount := Path(part.mountpoint)) == resolved or mount in resolved.parents]
    return max(above)[1] if above else None
