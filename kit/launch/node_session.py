"""One node's part of a multi-node run: the same command on every node, one bundle from node 0.

Every node's agent joins node 0's store (kit.launch.rendezvous); node 0 creates the staging
folder in the shared output folder and hands its name out; every other node must see it there
(else the run stops before training: exit 2 on every node). Clocks are compared with node 0's
(kit.launch.clock), then each node samples its own telemetry into ``telemetry-chunks/node<K>/``
while torch's elastic agent runs its ranks (kit.launch.elastic), whose results, steps and logs
land in the shared staging folder. At the end every agent writes its node record and measures
its clock again; node 0 waits for each live agent, then assembles one bundle through the same
path as a one-node run (kit.launch.assemble) and tells the others how the run ended.
"""

import json
import logging
import os
import secrets
import shutil
import socket
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from kit.bundle.writer import BundleStaging, new_bundle_id
from kit.cache import compile_cache
from kit.config.run import RunConfig
from kit.errors import KitInputError
from kit.launch.assemble import NodeData, RunEnd, assemble_bundle, read_sampler_report, run_end
from kit.launch.clock import ClockOffset, measure_clock, serve_clock
from kit.launch.elastic import launch_elastic
from kit.launch.inventory import node_inventory
from kit.launch.local import LaunchOutcome
from kit.launch.node_merge import node_chunks, node_exits, node_parts, where
from kit.launch.rankfile import (
    NODES_DIR,
    NodeRecord,
    read_node_record,
    read_rank_result,
    write_config,
    write_launcher_record,
    write_node_record,
)
from kit.launch.rendezvous import NodeLink, NodeRole
from kit.launch.session import (
    SessionResult,
    missing_reason,
    not_published,
    progress_watcher,
    sample_and_launch,
    telemetry_plan,
    warm_imports,
)
from kit.launch.signals import SignalCounter
from kit.launch.watchdog import stall_end, stall_watchdog
from kit.telemetry.sampler import SamplerReport

SHARED_TOKEN = f"{NODES_DIR}/shared-folder-token"
"""A file node 0 writes into the staging folder; every node must read the same token there."""
CLOCK_END_TIMEOUT_S = 10.0
"""How long node 0 waits for a node that reported its end to measure its clock again."""

log = logging.getLogger("kit.node")


def _agent_log(staging: BundleStaging, node: int) -> None:
    """Send this agent's and torch's elastic agent's log lines to ``logs/node<K>.log``."""
    handler = logging.FileHandler(staging.logs_dir / f"node{node}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("kit.node", "torch.distributed.elastic"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # the node's log has them; the terminal shows progress


def _open_staging(cfg: RunConfig, out: Path, command: list[str], link: NodeLink) -> BundleStaging:
    """Node 0 creates the staging folder; every node checks it sees it in its own ``out``.

    Raises:
        KitInputError: A node does not see node 0's staging folder (``out`` is not shared);
            raised on every node, node 0's folder removed.
    """
    role = link.role
    if role.node == 0:
        staging = BundleStaging(out, new_bundle_id(cfg.workload.name, cfg.platform.name))
        token = secrets.token_hex(16)
        (staging.path / NODES_DIR).mkdir()
        (staging.path / SHARED_TOKEN).write_text(token)
        write_launcher_record(staging.path, command, [])
        write_config(staging.path, cfg)
        link.put("bundle", json.dumps({"name": staging.path.name, "token": token}))
        answers = {k: link.get(f"shared/{k}") for k in range(1, role.nodes)}
        unshared = [a for a in answers.values() if a != "yes"]
        verdict = unshared[0] if unshared else "ok"
        link.put("go", verdict)
        if unshared:
            shutil.rmtree(staging.path, ignore_errors=True)
            raise KitInputError(verdict)
        return staging
    offer = json.loads(link.get("bundle"))
    path = Path(out) / offer["name"]
    try:
        seen = (path / SHARED_TOKEN).read_text()
    except OSError:
        seen = None
    if seen != offer["token"]:
        why = (f"--out {out} is not shared between nodes: node {role.node} "
               f"({socket.gethostname()}) does not see node 0's staging folder {path}; put "
               "--out on a file system every node mounts (NFS, Lustre, GPFS)")
        link.put(f"shared/{role.node}", why)
        raise KitInputError(why)
    link.put(f"shared/{role.node}", "yes")
    verdict = link.get("go")
    if verdict != "ok":
        raise KitInputError(verdict)
    return BundleStaging.reopen(path)


def _clock_start(link: NodeLink) -> ClockOffset | None:
    """Node 0 answers every node in turn; the others measure their offset."""
    role = link.role
    if role.node == 0:
        for k in range(1, role.nodes):
            serve_clock(link.store, "start", k, role.timeout_s)
        return None
    return measure_clock(link.store, "start", role.node)


def _interruption(interrupts: SignalCounter) -> str:
    """What stopped the node, with Slurm's reason when Slurm sent the signal."""
    from kit.launch.slurm import termination_cause

    cause = termination_cause()
    return interrupts.describe() + (f" ({cause})" if cause else "")


def _exits(outcome: LaunchOutcome) -> dict[int, list[object]]:
    return {r: [e.code, e.signal, e.t] for r, e in outcome.exits.items()}


def run_node_session(cfg: RunConfig, out: Path, command: list[str], role: NodeRole,
                     ends_process: bool = False) -> SessionResult | None:
    """Run this node's part of ``cfg``; node 0 publishes the bundle and returns it.

    ``ends_process``: SIGINT/SIGTERM stay ignored once the node is done (kit.launch.signals).

    Returns:
        The published run on node 0; on other nodes how node 0 said the run ended (None when
        node 0 did not say within the rendezvous timeout).

    Raises:
        KitInputError: A node did not join, or ``out`` is not shared between nodes.
        RunNotPublished: Node 0 could not write the bundle.
    """
    link = NodeLink(role)
    cache = compile_cache.prepare()  # each node's ranks inherit their node's cache
    try:
        warm_imports()
        with SignalCounter(final=ends_process) as interrupts:
            staging = _open_staging(cfg, out, command, link)
            _agent_log(staging, role.node)
            log.info("node %d of %d joined the rendezvous at %s", role.node, role.nodes,
                     role.endpoint)
            per_node = cfg.ranks_per_node
            record = NodeRecord(
                node=role.node, host=socket.gethostname(), pid=os.getpid(),
                create_time=psutil.Process().create_time(),
                ranks=list(range(role.node * per_node, (role.node + 1) * per_node)),
                inventory=node_inventory(used=per_node).model_dump(mode="json"),
                slurm_job_id=os.environ.get("SLURM_JOB_ID"),
            )
            clock = _clock_start(link)
            if clock is not None:
                record.clock_start = asdict(clock)
                log.info("clock offset to node 0: %+.6f s (+/- %.6f s)", clock.offset_s,
                         clock.uncertainty_s)
            write_node_record(staging.path, record)
            chunks = node_chunks(staging.chunks_dir, role.node)
            chunks.mkdir(parents=True, exist_ok=True)
            watchdog = stall_watchdog(cfg, staging.path, role.node, interrupts)

            def started(pids: list[int]) -> None:
                if watchdog is not None:
                    watchdog.know_ranks(pids)
                record.rank_pids = pids
                write_node_record(staging.path, record)

            outcome, report, notes, launch_error = sample_and_launch(
                cfg, chunks, role.node,
                lambda on_poll: launch_elastic(cfg, staging.path, staging.logs_dir, role,
                                               interrupts, on_poll, on_started=started),
                progress_watcher(cfg, staging.path) if role.node == 0 else None, watchdog)
            facts = report.devices if report else {}
            gpus = next((d for name, d in facts.items() if d and name != "replay"), None)
            record.inventory = node_inventory(gpus, per_node).model_dump(mode="json")
            record.ended, record.exits, record.killed = True, _exits(outcome), outcome.killed
            record.interrupted_by = _interruption(interrupts) if interrupts.count else None
            record.error, record.notes = launch_error, notes
            write_node_record(staging.path, record)
            log.info("ranks done: %s", record.exits)
            if role.node != 0:
                return _report_end(link, cfg)
            return _merge_and_publish(cfg, staging, command, link, report, cache)
    finally:
        link.close()


def _report_end(link: NodeLink, cfg: RunConfig) -> SessionResult | None:
    """A node other than 0: say the ranks are done, measure the clock, await the verdict."""
    role = link.role
    try:
        link.put(f"end/{role.node}", "1")
        clock = measure_clock(link.store, "end", role.node)
        link.put(f"clock-end/{role.node}", json.dumps(asdict(clock)))
        verdict = json.loads(link.get("status"))
        link.put(f"status-seen/{role.node}", "1")
    except Exception as e:  # node 0 is gone: its bundle (if any) is all there is
        log.info("no verdict from node 0: %s", e)
        return None
    return SessionResult(bundle=Path(verdict["bundle"]), status=verdict["status"],
                         error=verdict["error"], summary=verdict["summary"], cfg=cfg)


def _clock_end(link: NodeLink, node: int) -> ClockOffset | None:
    """Node 0: serve ``node``'s end-of-run clock measurement; None when it did not come."""
    try:
        serve_clock(link.store, "end", node, CLOCK_END_TIMEOUT_S)
        return ClockOffset(**json.loads(link.get(f"clock-end/{node}", CLOCK_END_TIMEOUT_S)))
    except Exception as e:  # the node died between its end and its clock
        log.info("node %d: no end clock: %s", node, e)
        return None


def _merge_and_publish(cfg: RunConfig, staging: BundleStaging, command: list[str],
                       link: NodeLink, report: SamplerReport | None,
                       cache: dict[str, Any] | None) -> SessionResult:
    """Node 0: wait for every live agent's end, merge the nodes' records, publish, tell all
    (``cache``: node 0's compile cache, for the manifest)."""
    role = link.role
    records: list[NodeRecord | None] = [read_node_record(staging.path, 0)]
    ends: list[dict[str, float] | None] = [None]
    for k in range(1, role.nodes):
        reported = link.wait_for(k, f"end/{k}", role.timeout_s)
        end_clock = _clock_end(link, k) if reported else None
        ends.append(asdict(end_clock) if end_clock else None)
        records.append(read_node_record(staging.path, k))
    reports = [report, *(read_sampler_report(node_chunks(staging.chunks_dir, k))
                         for k in range(1, role.nodes))]
    nodes = node_parts(staging.chunks_dir, records, ends, reports)
    outcome = LaunchOutcome(exits=node_exits(records, nodes))
    dead, notes, interrupted_by = [], [], None
    for k, rec in enumerate(records):
        if rec is None or not rec.ended:
            dead.append((k, rec))
            continue
        outcome.interrupted |= rec.interrupted_by is not None
        interrupted_by = interrupted_by or (
            f"node {k}: {rec.interrupted_by}" if rec.interrupted_by else None)
        outcome.killed += rec.killed
        notes += rec.notes
        if rec.error:
            notes.append(f"node {k}: {rec.error}")
    results = [read_rank_result(staging.path, r) for r in range(cfg.world_size)]
    end = stall_end(run_end(outcome, results, staging.logs_dir, interrupted_by,
                            where=lambda r: where(r // cfg.ranks_per_node, nodes)),
                    staging.logs_dir)
    if dead and end.status != "interrupted":
        end = RunEnd("failed", _dead_agent(dead[0], results, nodes), end.exits)
    elif end.status != "interrupted" and any(rec and rec.error for rec in records):
        # an agent that raised (torch's agent, its rendezvous) started no rank or lost them: its
        # error says why, the ranks' "ended without writing its result" would not
        end = RunEnd("failed", next(f"node {k}: {rec.error}" for k, rec in enumerate(records)
                                    if rec and rec.error), end.exits)
    end.notes += notes
    _, missing_why = telemetry_plan(cfg)
    job = None
    if cfg.launcher == "slurm":
        from kit.launch.slurm import record_job

        job = record_job(staging.path)
    try:
        path, summary = assemble_bundle(staging, cfg, command, end, report,
                                        missing_reason(missing_why, report, notes), nodes, job,
                                        compile_cache=cache)
    except OSError as e:
        unpublished = not_published(e, staging)
        link.put("status", json.dumps({"status": "failed", "error": str(unpublished),
                                       "bundle": "", "summary": {}}))
        raise unpublished from e
    link.put("status", json.dumps({"status": end.status, "error": end.error,
                                   "bundle": str(path.resolve()), "summary": summary}))
    for k in range(1, role.nodes):  # the store lives in this process: let them read it first
        if (rec := records[k]) is not None and rec.ended:
            link.wait_for(k, f"status-seen/{k}", CLOCK_END_TIMEOUT_S)
    return SessionResult(bundle=path, status=end.status, error=end.error, summary=summary,
                         cfg=cfg)


def _dead_agent(dead: tuple[int, NodeRecord | None], results: list, nodes: list[NodeData]) -> str:
    """The headline for an agent that ended without its end record."""
    k, rec = dead
    if rec is None:
        return (f"{where(k, nodes)}: its agent never wrote its record (it died while starting)")
    ranks = ", ".join(map(str, rec.ranks))
    said = next((res.error for r in rec.ranks if (res := results[r]) and res.error), None)
    tail = f"; its ranks {ranks} stopped: {said}" if said else f"; its ranks {ranks} ended too"
    return (f"{where(k, nodes)}: its agent (pid {rec.pid} on {rec.host}) was killed without "
            f"reporting (SIGKILL: by a user, the OOM killer or the job's end){tail}")
