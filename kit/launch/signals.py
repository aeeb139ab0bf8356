"""SIGINT and SIGTERM to the launcher, counted for the whole run instead of killing it.

A job's end (``timeout``, Slurm's ``scancel`` and time limit, systemd, ``docker stop``) sends
SIGTERM to every process of the job, often twice or mixed with a Ctrl-C. The launcher must
still publish a bundle, so from staging to publication both signals only count: the first
stops the ranks at a step boundary, a later one cuts the wait short, and assembly goes on.
"""

import signal
import time

HANDLED = (signal.SIGINT, signal.SIGTERM)


class SignalCounter:
    """Within ``with``: SIGINT/SIGTERM increment :attr:`count` instead of ending the process.

    Attributes:
        count: Signals received so far.
        first: Name of the first signal (e.g. ``"SIGTERM"``), or None.
        first_t: Unix time of the first signal, or None.
    """

    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None
        self.first_t: float | None = None
        self._old = {s: signal.getsignal(s) for s in HANDLED}

    def __enter__(self) -> "SignalCounter":
        for s in HANDLED:
            signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.first is None:
            self.first, self.first_t = signal.Signals(signum).name, time.time()

    def describe(self) -> str:
        """One line for the manifest: what stopped the run."""
        more = f" ({self.count} signals in all)" if self.count > 1 else ""
        return f"stopped by signal {self.first}{more} before all steps ran"
