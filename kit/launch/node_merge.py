"""The nodes' records of a multi-node run folded into what assembly needs, without torch.

Two callers: node 0's agent, which merges the records live once every agent reported
(kit.launch.node_session), and ``bundle recover``, which merges what a staging folder holds when
node 0's agent died before publishing (kit.launch.recover). Both build each node's inventory,
telemetry folder and clock offset, and the ranks' exits on node 0's clock, the same way.
"""

from pathlib import Path

from kit.bundle.schema import ClockSync, NodeInventory
from kit.launch.assemble import NodeData, read_sampler_report
from kit.launch.inventory import node_inventory
from kit.launch.local import RankExit
from kit.launch.rankfile import NodeRecord, read_node_record
from kit.telemetry.sampler import SamplerReport

NODE0_CLOCK = ClockSync(offset_start_s=0.0, uncertainty_start_s=0.0, offset_end_s=0.0,
                        uncertainty_end_s=0.0, applied_s=0.0)
"""Node 0's clock against itself: the time axis every other node is put on."""


def node_chunks(chunks_dir: Path, node: int) -> Path:
    """Where node ``node``'s sampler writes its telemetry chunks and report."""
    return chunks_dir / f"node{node}"


def clock_sync(start: dict[str, float] | None, end: dict[str, float] | None) -> ClockSync:
    """A node's clock record from its start and end measurements (each a ClockOffset as a
    dict, or None where it was not measured); applied: the mean of those measured."""
    measured = [c["offset_s"] for c in (start, end) if c is not None]
    return ClockSync(
        offset_start_s=start["offset_s"] if start else None,
        uncertainty_start_s=start["uncertainty_s"] if start else None,
        offset_end_s=end["offset_s"] if end else None,
        uncertainty_end_s=end["uncertainty_s"] if end else None,
        applied_s=sum(measured) / len(measured) if measured else 0.0,
    )


def read_node_records(staging: Path, nodes: int) -> list[NodeRecord | None]:
    """Every node's record in a staging folder, in node order (None: never written)."""
    return [read_node_record(staging, k) for k in range(nodes)]


def node_parts(chunks_dir: Path, records: list[NodeRecord | None],
               ends: list[dict[str, float] | None],
               reports: list[SamplerReport | None] | None = None) -> list[NodeData]:
    """Each node's inventory (with its clock), telemetry folder, sampler report and offset.

    Args:
        chunks_dir: The staging folder's telemetry folder.
        records: The nodes' records, in node order.
        ends: Each node's end-of-run clock measurement, or None.
        reports: Each node's sampler report; default: what each sampler left on disk.
    """
    out = []
    for k, rec in enumerate(records):
        sync = NODE0_CLOCK if k == 0 else clock_sync(rec.clock_start if rec else None, ends[k])
        chunks = node_chunks(chunks_dir, k)
        report = reports[k] if reports is not None else read_sampler_report(chunks)
        inventory = NodeInventory.model_validate(
            {**(rec.inventory if rec else node_inventory().model_dump(mode="json")),
             "clock": sync.model_dump()})
        out.append(NodeData(inventory, chunks, report, sync.applied_s))
    return out


def node_exits(records: list[NodeRecord | None], nodes: list[NodeData]) -> dict[int, RankExit]:
    """How the ranks of every node that recorded its end ended, on node 0's clock."""
    exits = {}
    for rec, node in zip(records, nodes, strict=True):
        if rec is None or not rec.ended:
            continue
        for r, (code, sig, t) in rec.exits.items():
            exits[r] = RankExit(code, sig, t + node.offset_s)
    return exits


def where(node: int, nodes: list[NodeData]) -> str:
    """``node 1 (n2)``: a node by index and by its Slurm node name or host name."""
    inv = nodes[node].inventory if node < len(nodes) else None
    name = (inv.slurm_node or inv.host) if inv else "?"
    return f"node {node} ({name})"
