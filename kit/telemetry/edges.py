"""The measured phase's edges, told to the node's sampler so it reads the energy counter then,
and the ranks' wait for that sampler's first sample before they train.

The sampler's slow lanes read the energy counter every 100-400 ms, so without help the last
reading before a run's end can come over a second before the last measured step ends. Local
rank 0 of each node therefore pokes its node's sampler when the first measured step starts and
when the last one has ended: one byte into a named pipe the sampler created and waits on
beside its other wake-ups. A poke is best effort and never blocks a rank: no sampler, a full
pipe or one without a reader are all ignored (the readings then bracket the span less
tightly, and :mod:`kit.metrics.energy` still interpolates).

The sampler starts in parallel with the ranks and usually samples long before their first step.
On a loaded host it may not: a suite run beside a busy loop per core once had the sampler take
its first sample after a 3-step CPU run had ended, and the bundle held no power at all. So the
sampler marks its first sample with a file beside the pipe (:func:`mark_sampler_ready`; the
launcher marks it too when the sampler failed to start), and every rank waits for that file
before its first step (:func:`wait_for_sampler`).
"""

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

EDGE_ENV = "CHARLLM_SAMPLER_EDGE"
"""Environment variable holding the path of the node sampler's pipe, set for the ranks."""

READY_NAME = "ready"
"""The file beside the pipe that says the sampler has taken its first sample (or never will)."""

SAMPLER_START_TIMEOUT_S = 60.0
"""How long the launcher waits for its sampler's first sample, and a rank for the file."""

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


def mark_sampler_ready(pipe: Path) -> None:
    """Say, beside the sampler's pipe ``pipe``, that the ranks need not wait for it any more:
    it has taken its first sample, or it failed to start. Nothing when the folder is gone: the
    launcher stopped the sampler before it sampled (a signal while the ranks started), and
    no rank waits."""
    try:
        pipe.with_name(READY_NAME).touch()
    except FileNotFoundError:
        pass


def wait_for_sampler(stopped: Callable[[], bool] = lambda: False,
                     timeout_s: float = SAMPLER_START_TIMEOUT_S, poll_s: float = 0.005) -> float:
    """Wait until this node's sampler has sampled (no wait without one); the seconds waited.

    Ends early once ``stopped()`` (the rank was told to stop), and gives up after
    ``timeout_s``, when the launcher gives up on the sampler too.
    """
    path = os.environ.get(EDGE_ENV)
    if not path:
        return 0.0
    ready = Path(path).with_name(READY_NAME)
    start = time.monotonic()
    while not (ready.exists() or stopped()) and time.monotonic() - start < timeout_s:
        time.sleep(poll_s)
    return time.monotonic() - start
