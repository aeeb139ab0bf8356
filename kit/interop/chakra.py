"""MLCommons Chakra execution traces from a rank's profile: link, convert, mark collectives.

``run --chakra`` records PyTorch's ExecutionTraceObserver output (the *host* ET) together with
the Kineto trace (kit.launch.profiling). This module turns the pair into a Chakra ET with
Chakra's own tools, when the ``chakra`` package is installed (it is not on the package index;
docs/profiling.md says how to install it; the kit works without it):

1. ``chakra_trace_link``'s :class:`TraceLinker` merges host ET and Kineto trace. Its
   synchronization-dependency pass runs Holistic Trace Analysis' critical-path analysis, which
   needs device kernels: on a CPU-only trace it fails (with pandas < 3 the whole tool exits),
   so on such a trace the pass is skipped; there are no device syncs to find anyway.
2. ``chakra_converter``'s :class:`PyTorchConverter` writes the protobuf ET.
3. The converter marks only NCCL kernels as collectives; gloo's collectives (CPU ops named
   ``gloo:<collective>``) stay compute nodes. :func:`mark_collectives` rewrites those nodes as
   ``COMM_COLL_NODE`` (``COMM_SEND_NODE``/``COMM_RECV_NODE`` for point-to-point) with Chakra's
   ``comm_type`` and ``comm_size`` (bytes, from the recorded input shapes), so a simulator
   sees the all-reduce as one. Collective types use kit.metrics.kernels' vendor-neutral names.
"""

import ast
import logging
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from kit.metrics.kernels import collective_type, dtype_bytes

log = logging.getLogger(__name__)

_COMM_TYPE = {"AllReduce": "ALL_REDUCE", "AllGather": "ALL_GATHER",
              "ReduceScatter": "REDUCE_SCATTER", "AllToAll": "ALL_TO_ALL",
              "Broadcast": "BROADCAST"}
"""kit's collective type -> Chakra's CollectiveCommType name."""
_OTHER_COMM = (("barrier", "BARRIER"), ("reduce", "REDUCE"), ("gather", "GATHER"),
               ("scatter", "SCATTER"))
"""gloo collectives kit files under OtherComm, by the name after ``gloo:``."""


@lru_cache(maxsize=1)
def chakra_missing() -> str | None:
    """Why Chakra's linker and converter cannot be used here, or None when they can."""
    try:
        from chakra.src.converter.pytorch_converter import PyTorchConverter  # noqa: F401
        from chakra.src.trace_link.trace_linker import TraceLinker  # noqa: F401
    except ImportError as e:
        why = f"the chakra package is not usable: {e}"
        log.info(why)
        return why
    return None


def _has_device_activity(kineto_trace: Path) -> bool:
    import json

    events = json.loads(kineto_trace.read_text(encoding="utf-8")).get("traceEvents", [])
    return any(isinstance(e, dict) and e.get("cat") == "kernel" for e in events)


def link_traces(rank: int, host_et: Path, kineto_trace: Path, out: Path) -> str | None:
    """Link ``host_et`` and ``kineto_trace`` into Chakra's host + device JSON at ``out``.

    Returns:
        A note when the synchronization-dependency pass was skipped on a trace with device
        kernels because it failed there too (the ET then lacks those edges), else None.
    """
    from chakra.src.trace_link.trace_linker import TraceLinker

    class _HostOnlyLinker(TraceLinker):
        """Skips HTA's critical-path pass, which fails on traces without device kernels."""

        def load_sync_dependencies(self, *args: Any, **kwargs: Any) -> dict[int, list[int]]:
            return {}

    if not _has_device_activity(kineto_trace):
        _HostOnlyLinker().link(rank, str(host_et), str(kineto_trace), str(out))
        return None
    try:
        TraceLinker().link(rank, str(host_et), str(kineto_trace), str(out))
        return None
    except Exception as e:  # HTA's pass on an unexpected trace; the rest still links
        _HostOnlyLinker().link(rank, str(host_et), str(kineto_trace), str(out))
        return (f"chakra: rank {rank}: sync dependencies skipped, HTA's critical path failed "
                f"({type(e).__name__}: {e})".splitlines()[0])


def _comm_bytes(shapes: str, types: str) -> int | None:
    """Bytes of a node's tensor inputs, from the converter's ``str(list)`` shapes and types."""
    try:
        dims, kinds = ast.literal_eval(shapes), ast.literal_eval(types)
    except (ValueError, SyntaxError):
        return None
    total = 0
    for shape, kind in zip(dims, kinds, strict=False):
        size = dtype_bytes(kind) if isinstance(kind, str) and kind.startswith("Tensor") else None
        if size and isinstance(shape, list) and all(isinstance(d, int) for d in shape):
            total += math.prod(shape) * size
    return total or None


def _mark(node: Any, pb: Any) -> bool:
    """Make a gloo collective's compute node a communication node; False when it is not one."""
    name = node.name
    kind = collective_type(name) if name.startswith("gloo:") else None
    if kind is None or node.type != pb.COMP_NODE:
        return False
    op = name.removeprefix("gloo:").lower()
    size = _comm_bytes(node.inputs.shapes, node.inputs.types)
    if kind == "SendRecv":
        node.type = pb.COMM_RECV_NODE if "recv" in op else pb.COMM_SEND_NODE
    else:
        comm = _COMM_TYPE.get(kind) or next((c for key, c in _OTHER_COMM if key in op), None)
        if comm is None:
            return False
        node.type = pb.COMM_COLL_NODE
        node.attr.append(pb.AttributeProto(name="comm_type",
                                           int64_val=pb.CollectiveCommType.Value(comm)))
    if size is not None:
        node.attr.append(pb.AttributeProto(name="comm_size", int64_val=size))
    return True


def mark_collectives(et: Path) -> int:
    """Rewrite gloo's collectives in a Chakra ET as communication nodes; return how many."""
    from chakra.schema.protobuf import et_def_pb2 as pb
    from chakra.src.third_party.utils.protolib import decodeMessage, encodeMessage, openFileRd

    handle = openFileRd(str(et))
    try:
        meta = pb.GlobalMetadata()
        decodeMessage(handle, meta)
        nodes = []
        while True:
            node = pb.Node()
            if not decodeMessage(handle, node):
                break
            nodes.append(node)
    finally:
        handle.close()
    marked = sum(_mark(n, pb) for n in nodes)
    tmp = et.with_name(f".{et.name}.tmp")
    with tmp.open("wb") as f:
        encodeMessage(f, meta)
        for node in nodes:
            encodeMessage(f, node)
    os.replace(tmp, et)
    return marked


def link_and_convert(rank: int, host_et: Path, kineto_trace: Path, out: Path) -> list[str]:
    """Link, convert and mark one rank's traces into the Chakra ET ``out``.

    Returns:
        Notes for the run: the linker's (:func:`link_traces`), and how many gloo collectives
        were marked as communication nodes (when any were).
    """
    from chakra.src.converter.pytorch_converter import PyTorchConverter

    linked = out.with_name(f".{out.stem}.linked.json")
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        note = link_traces(rank, host_et, kineto_trace, linked)
        PyTorchConverter().convert(str(linked), str(tmp), simulate=False)
        marked = mark_collectives(tmp)
        os.replace(tmp, out)
    finally:
        linked.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    marked_note = f"chakra: rank {rank}: {marked} gloo collectives marked as communication nodes"
    return [n for n in (note, marked_note if marked else None) if n]
