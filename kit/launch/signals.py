"""SIGINT and SIGTERM to the launcher, counted for the whole run instead of killing it.

A job's end (``timeout``, Slurm's ``scancel`` and time limit, systemd, ``docker stop``) sends
SIGTERM to every process of the job, often twice or mixed with a Ctrl-C. The launcher must
still publish a bundle, so from staging to publication both signals only count: the first
stops the ranks at a step boundary, a later one cuts the wait short, and assembly goes on.

A SIGTERM that repeats a SIGTERM within :data:`DUPLICATE_S` is the same request delivered twice
(under Slurm, ``scancel`` signals the task directly and ``srun`` forwards it again), so it does
not cut the ranks' step-boundary stop short; a Ctrl-C, or a SIGTERM later than that, does.

Once the bundle is published a stop request has nothing left to stop: the command that ran it
keeps counting signals while it prints the result and, on leaving, ignores them until the
process ends (:class:`SignalCounter` with ``final=True``), so its exit code is decided once and
does not depend on when a late signal lands.
"""

import signal
import time

HANDLED = (signal.SIGINT, signal.SIGTERM)
DUPLICATE_S = 2.0
"""A SIGTERM this soon after the previous SIGTERM counts as the same stop request."""


class SignalCounter:
    """Within ``with``: SIGINT/SIGTERM increment :attr:`count` instead of ending the process.

    Attributes:
        count: Stop requests so far (signals, less repeated SIGTERMs within DUPLICATE_S).
        received: Signals received so far.
        first: Name of the first signal (e.g. ``"SIGTERM"``), or None.
        first_t: Unix time of the first signal, or None.
    """

    def __init__(self, final: bool = False) -> None:
        """``final``: on leaving, ignore SIGINT/SIGTERM for the rest of the process instead of
        restoring the handlers found on entry (no moment where a default handler can end it)."""
        self.final = final
        self.count = 0
        self.received = 0
        self.first: str | None = None
        self.first_t: float | None = None
        self._last_term: float | None = None
        self._old = {s: signal.getsignal(s) for s in HANDLED}

    def __enter__(self) -> "SignalCounter":
        for s in HANDLED:
            signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, signal.SIG_IGN if self.final else h)

    def _handle(self, signum: int, frame: object) -> None:
        now = time.monotonic()
        self.received += 1
        duplicate = (signum == signal.SIGTERM and self._last_term is not None
                     and now - self._last_term < DUPLICATE_S)
        if signum == signal.SIGTERM:
            self._last_term = now
        if not duplicate:
            self.count += 1
        if self.first is None:
            self.first, self.first_t = signal.Signals(signum).name, time.time()

    def describe(self) -> str:
        """One line for the manifest: what stopped the run."""
        more = f" ({self.received} signals in all)" if self.received > 1 else ""
        return f"stopped by signal {self.first}{more} before all steps ran"
