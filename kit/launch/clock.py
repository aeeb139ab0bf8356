"""How far each node's wall clock is from node 0's, measured over the rendezvous store.

Step markers and telemetry rows carry each node's own ``time.time()``; nodes' clocks differ by
milliseconds (NTP) to seconds (none). Before training and after it, every node asks node 0 for
its time a few times, NTP-style: the round with the shortest round trip gives the offset
(node 0's time minus the midpoint of the round trip) and half that round trip bounds its error.
The bundle shifts a node's rows by its offset onto node 0's clock.
"""

import time
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

ROUNDS = 5
"""Timestamp exchanges per measurement; the shortest round trip wins."""


@dataclass(frozen=True)
class ClockOffset:
    """One node's clock against node 0's.

    Attributes:
        offset_s: Node 0's clock minus this node's, seconds: add it to this node's unix times.
        uncertainty_s: Half the shortest round trip, seconds: the offset is right within it.
        t: When it was measured, node 0's clock, unix seconds.
    """

    offset_s: float
    uncertainty_s: float
    t: float


def _key(tag: str, node: int, i: int, what: str) -> str:
    return f"kit/clock/{tag}/{node}/{i}/{what}"


def serve_clock(store: dist.Store, tag: str, node: int, timeout_s: float) -> None:
    """Node 0: answer ``node``'s :data:`ROUNDS` asks with its time.

    Raises:
        RuntimeError: (from the store) the node did not ask within ``timeout_s``.
    """
    for i in range(ROUNDS):
        store.wait([_key(tag, node, i, "ask")], timedelta(seconds=timeout_s))
        store.set(_key(tag, node, i, "tell"), repr(time.time()))


def measure_clock(store: dist.Store, tag: str, node: int) -> ClockOffset:
    """Node ``node`` (not 0): measure its offset to node 0, which runs :func:`serve_clock`."""
    best: ClockOffset | None = None
    for i in range(ROUNDS):
        t0 = time.time()
        store.set(_key(tag, node, i, "ask"), "1")
        theirs = float(store.get(_key(tag, node, i, "tell")))
        t1 = time.time()
        sample = ClockOffset(theirs - (t0 + t1) / 2, (t1 - t0) / 2, theirs)
        if best is None or sample.uncertainty_s < best.uncertainty_s:
            best = sample
    assert best is not None
    return best

