"""Write a file so that readers see the old content or the new, never half of it.

Every file the kit writes while a run goes (rank results, telemetry chunks, the sampler's
report, bundle files, the sweep index) goes through here, so a full disk or a kill mid-write
leaves no temporary behind and the error names the file.
"""

import os
from collections.abc import Callable
from pathlib import Path


def write_atomic(dest: Path, write: Callable[[Path], object], fsync: bool = False) -> None:
    """Write ``dest`` by ``write(tmp)`` on a temporary beside it, then one rename.

    Args:
        dest: The file to (re)place.
        write: Writes the whole content to the path it is given.
        fsync: Flush the temporary to disk before the rename (for files that must survive a
            crash of the machine, not only of the process).

    Raises:
        OSError: Writing failed; the temporary is removed and the error names ``dest``.
    """
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        write(tmp)
        if fsync:
            with tmp.open("rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            raise OSError(e.errno, e.strerror, str(dest)) from e
        raise
