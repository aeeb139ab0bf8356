"""The measured phase's edges, told to the node's sampler so it reads the energy counter then.

The sampler's slow lanes read the energy counter every 100-400 ms, so without help the last
reading before a run's end can come over a second before the last measured step ends. Local
rank 0 of each node therefore pokes its node's sampler when the first measured step starts and
when the last one has ended: one byte into a named pipe the sampler created and waits on
beside its other wake-ups. A poke is best effort and never blocks a rank: no sampler, a full
pipe or one without a reader are all ignored (the readings then bracket the span less
tightly, and :mod:`kit.analysis.energy` still interpolates).
"""

import os
import shutil
import tempfile
from pathlib import Path

import psutil

EDGE_ENV = "CHARLLM_SAMPLER_EDGE"
"""Environment variable holding the path of the node sampler's pipe, set for the ranks."""

EDGE_DIR_PREFIX = "charllm-sampler-"
"""The pipe's folder in the temporary directory: ``<prefix><launcher pid>-<random>``."""


def make_edge_dir() -> Path:
    """A new folder for this process's sampler pipe, after removing the folders that killed
    launchers left (SIGKILL runs no clean-up): those of this user whose launcher pid is gone.

    The folder lives in the temporary directory rather than the run's staging folder, which
    may be on a shared file system; the pid in its name is what tells a stale one.
    """
    tmp = Path(tempfile.gettempdir())
    for old in tmp.glob(f"{EDGE_DIR_PREFIX}*-*"):
        pid = old.name[len(EDGE_DIR_PREFIX):].split("-", 1)[0]
        try:
            stale = (pid.isdigit() and not psutil.pid_exists(int(pid))
                     and old.stat().st_uid == os.getuid())
        except OSError:  # removed meanwhile
            continue
        if stale:
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{EDGE_DIR_PREFIX}{os.getpid()}-", dir=tmp))


def make_edge_pipe(path: Path) -> None:
    """Create the named pipe a sampler waits on for edge pokes."""
    os.mkfifo(path, 0o600)


def open_edge_pipe(path: Path) -> tuple[int, int]:
    """The sampler's ends of its pipe: a non-blocking read end to wait on, and a write end it
    keeps open itself so that the read end never reports end-of-file between pokes."""
    read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    keep_fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    return read_fd, keep_fd


def poke_sampler() -> None:
    """Tell this node's sampler that the measured phase starts or ends (best effort)."""
    path = os.environ.get(EDGE_ENV)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no pipe, or no sampler reading it
        return
    try:
        os.write(fd, b"e")
    except OSError:  # a full pipe already holds a poke
        pass
    finally:
        os.close(fd)
