"""The local launcher's rendezvous port: free, and not one the kernel hands to connections."""

import socket
from pathlib import Path

import pytest

from kit.launch.local import EPHEMERAL_RANGE, free_port


@pytest.mark.skipif(not EPHEMERAL_RANGE.exists(), reason="no ephemeral port range (not Linux)")
def test_the_store_port_is_free_and_outside_the_ephemeral_range() -> None:
    lo, hi = (int(v) for v in Path(EPHEMERAL_RANGE).read_text().split())
    for _ in range(20):
        port = free_port()
        assert not lo <= port <= hi
        with socket.socket() as s:  # rank 0's store can bind it
            s.bind(("127.0.0.1", port))


def test_a_port_taken_by_a_listener_is_not_handed_out() -> None:
    held = []
    try:
        for _ in range(30):  # hold what it hands out: it must never give one of them again
            port = free_port()
            assert port not in [s.getsockname()[1] for s in held]
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
    finally:
        for s in held:
            s.close()
