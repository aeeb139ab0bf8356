"""Where the node agents of a multi-node run meet: node 0's store on the rendezvous endpoint.

Node 0 hosts a torch.distributed ``TCPStore`` on ``--rdzv-endpoint``; every other node's agent
connects to it within ``--rdzv-timeout``, so a node that never comes is an error naming the
endpoint and the timeout, never a hang. The store is multi-tenant: torch's static rendezvous,
which the elastic agent runs next in the same process to start the ranks, shares its server, so
a run needs one port. Through it node 0 hands out the bundle id, heartbeats tell node 0 which
agents still live, and node 0 tells every node how the run ended.
"""

import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from kit.errors import KitInputError

ANSWER_GRACE_S = 10.0
"""How long past ``--rdzv-timeout`` a node waits for node 0's store before it gives up.

torch's ``TCPStore`` does not keep to its timeout on its own: with nobody listening it retried
once more after its 300 s, following a random back-off (84 s, seen with torch 2.13), and once
connected it waits for the server's first answer without any limit, so a port where something
else listens (node 0's port taken by another program, a wrong ``--rdzv-endpoint``) would hold
the node forever."""
PROBE_S = 5.0
"""How long the check whether anything listens on the endpoint may take to connect."""
HEARTBEAT_S = 0.5
"""How often each agent says it is alive."""
SILENT_DEAD_S = 5.0
"""An agent whose heartbeat has not changed for this long is taken for dead."""


@dataclass(frozen=True)
class NodeRole:
    """Where this node's agent stands in a multi-node run.

    Attributes:
        node: This node's index, 0 .. nodes-1; node 0 hosts the store and publishes the bundle.
        nodes: Nodes in the run.
        host: Host of the rendezvous endpoint (node 0's address).
        port: Its TCP port.
        timeout_s: How long nodes may take to join, and to report at the end.
        run_id: Names the rendezvous (the Slurm job id, or the endpoint).
        slurm_node: The Slurm node name this agent runs on (SLURMD_NODENAME), or None.
    """

    node: int
    nodes: int
    host: str
    port: int
    timeout_s: float
    run_id: str
    slurm_node: str | None = None

    @property
    def endpoint(self) -> str:
        """``HOST:PORT``."""
        return f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port).

    Raises:
        KitInputError: It is not HOST:PORT with a port in 1..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise KitInputError(f"--rdzv-endpoint {text!r} is not HOST:PORT (e.g. node001:29500)")
    return host, int(port)


def torchrun_role(node_rank: int | None, nodes: int, endpoint: str | None,
                  timeout_s: float) -> NodeRole:
    """This node's role from ``--node-rank`` and ``--rdzv-endpoint``.

    Raises:
        KitInputError: One is missing, the endpoint is not HOST:PORT, or the rank is too big.
    """
    if node_rank is None or endpoint is None:
        raise KitInputError("--launcher torchrun needs --node-rank K (0 on the node that hosts "
                            "the rendezvous) and --rdzv-endpoint HOST:PORT (the same on every "
                            "node)")
    if node_rank >= nodes:
        raise KitInputError(f"--node-rank {node_rank} must be below --nodes {nodes}")
    host, port = parse_endpoint(endpoint)
    return NodeRole(node_rank, nodes, host, port, timeout_s, run_id=f"kit-{host}-{port}")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


@contextmanager
def _stderr_held() -> Iterator[bytearray]:
    """File descriptor 2 into a temporary file meanwhile; what it got is in the bytearray
    afterwards.

    torch's store logs each failed try to connect with a C++ stack trace of 40 lines; a node
    that cannot join says so in one line (the exception's first line in it), and one that joins
    passes on what was held.
    """
    said = bytearray()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield said
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            said += held.read()


def _listened_on(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` now."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_S):
            return True
    except OSError:
        return False


class NodeLink:
    """This agent's connection to node 0's store, with a heartbeat while it is open."""

    def __init__(self, role: NodeRole) -> None:
        """Join the rendezvous: node 0 waits for every node, the others for node 0.

        Raises:
            KitInputError: Not every node joined within the timeout (node 0), node 0 could not
                be reached (the others), or the port is taken.
        """
        self.role = role
        self.store = self._join()
        self._stop = threading.Event()
        self._beats: dict[int, tuple[bytes, float]] = {}
        self._beat_thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")
        self._beat_thread.start()

    def _join(self) -> dist.TCPStore:
        """Host (node 0) or reach node 0's store, bounded in time (:data:`ANSWER_GRACE_S`).

        The store is made on a thread: one that is still waiting for an answer once time is up
        is left behind (a daemon, in a socket read or torch's back-off) and the node exits with
        the error.
        """
        r = self.role
        made: list[dist.TCPStore] = []
        failed: list[BaseException] = []

        def make() -> None:
            try:
                made.append(dist.TCPStore(
                    r.host, r.port, world_size=r.nodes, is_master=r.node == 0,
                    timeout=timedelta(seconds=r.timeout_s), wait_for_workers=True,
                    multi_tenant=True))
            except Exception as e:  # DistStoreError, DistNetworkError, RuntimeError
                failed.append(e)

        thread = threading.Thread(target=make, daemon=True, name="rendezvous-join")
        with _stderr_held() as held:
            thread.start()
            thread.join(r.timeout_s + ANSWER_GRACE_S)
        if made:
            os.write(2, held)  # what torch said on the way, now that it joined
            return made[0]
        if failed:
            raise KitInputError(self._join_failure(failed[0])) from None
        if r.node == 0 or not _listened_on(r.host, r.port):  # torch still retrying, or waiting
            raise KitInputError(self._join_failure(TimeoutError("no answer in time"))) from None
        raise KitInputError(
            f"node {r.node}: {r.endpoint} accepts connections but did not answer as a "
            f"rendezvous store within {r.timeout_s + ANSWER_GRACE_S:g} s: another program "
            f"listens there; start node 0 with an --rdzv-endpoint port that is free on "
            f"{r.host} and give every node the same one")

    def _join_failure(self, e: BaseException) -> str:
        r = self.role
        if "EADDRINUSE" in str(e) or "address already in use" in str(e).lower():
            return (f"node {r.node}: port {r.port} on {r.host} is taken by another program: "
                    f"pick a free port for --rdzv-endpoint, the same on every node")
        if r.node == 0:
            return (f"node 0: not every node joined the rendezvous at {r.endpoint} within "
                    f"{r.timeout_s:g} s ({_first_line(e)}): start the same command with "
                    f"--node-rank 1..{r.nodes - 1} on the other nodes, or raise --rdzv-timeout")
        return (f"node {r.node}: could not reach node 0's rendezvous at {r.endpoint} within "
                f"{r.timeout_s:g} s ({_first_line(e)}): start node 0 (--node-rank 0) on "
                f"{r.host}, or check --rdzv-endpoint and --rdzv-timeout")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.store.set(f"kit/alive/{self.role.node}", repr(time.time()))
            except Exception:  # node 0 (the store) is gone: nothing left to tell
                return

    def close(self) -> None:
        """Stop the heartbeat and wait for it: a thread still inside a store call when the
        interpreter exits aborts the process (std::terminate). The store lives on."""
        self._stop.set()
        self._beat_thread.join(HEARTBEAT_S * 4)

    def put(self, key: str, value: str) -> None:
        """Set ``kit/<key>`` for every node to read."""
        self.store.set(f"kit/{key}", value)

    def get(self, key: str, timeout_s: float | None = None) -> str:
        """``kit/<key>``, waiting for it (default: the rendezvous timeout).

        Raises:
            RuntimeError: (a torch DistError) it did not appear in time, or the store is gone.
        """
        k = f"kit/{key}"
        self.store.wait([k], timedelta(seconds=timeout_s or self.role.timeout_s))
        return self.store.get(k).decode()

    def has(self, key: str) -> bool:
        """Whether ``kit/<key>`` is set."""
        return self.store.check([f"kit/{key}"])

    def alive(self, node: int) -> bool:
        """Whether ``node``'s agent beat within the last :data:`SILENT_DEAD_S` (node 0 asks).

        Judged by when this process saw the beat change, not by the beat's time: the nodes'
        clocks differ.
        """
        key = f"kit/alive/{node}"
        beat = self.store.get(key) if self.store.check([key]) else b""
        now = time.monotonic()
        last = self._beats.get(node)
        if last is None or last[0] != beat:
            self._beats[node] = (beat, now)
            return True
        return now - last[1] < SILENT_DEAD_S

    def wait_for(self, node: int, key: str, cap_s: float) -> bool:
        """Wait until ``kit/<key>`` is set while ``node``'s agent lives, at most ``cap_s``.

        Returns:
            True when it was set; False when the agent went silent or time ran out.
        """
        deadline = time.monotonic() + cap_s
        while time.monotonic() < deadline:
            if self.has(key):
                return True
            if not self.alive(node):
                return self.has(key)
            time.sleep(0.2)
        return self.has(key)
