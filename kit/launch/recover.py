"""``bundle recover``: publish the staging folder a killed launcher left behind.

A launcher killed outright (the OOM killer, SIGKILL, a node reboot) cannot publish its bundle,
but its staging folder holds what the run recorded: every step the ranks streamed, every
telemetry chunk, the ranks' logs, and the results of ranks that ended. This assembles them
through the same code as a live run (kit.launch.assemble), with status ``failed`` and the
reason, once the launcher is known to be dead.

A multi-node run's staging folder, left when node 0's agent (the one that publishes) died,
holds every node's part: each node's record (``nodes/``), telemetry, steps and logs. Recovery
merges them as node 0 would have (kit.launch.node_merge), once no agent or rank of the run still
runs on this host (agents on other hosts cannot be seen from here: their records say whether
they ended).
"""

import socket
from pathlib import Path

from kit.bundle.writer import SUMS_NAME, BundleStaging
from kit.config.run import RunConfig
from kit.errors import BundleError, KitInputError
from kit.launch.assemble import NodeData, RunEnd, assemble_bundle, read_sampler_report
from kit.launch.rankfile import (
    CONFIG_FILE,
    LAUNCHER_FILE,
    SCRATCH,
    LauncherRecord,
    NodeRecord,
    read_config,
    read_launcher_record,
    running_ranks,
    unpublished_reason,
)
from kit.telemetry.sampler import SamplerReport

UNSEEN_EXITS = "rank exit codes and times were not seen"


def _recovered_note(exits: str) -> str:
    """The note every recovered bundle carries; ``exits`` says where its ranks' ends came from."""
    return (f"recovered from the staging folder by `charllm-kit bundle recover`: {exits}; "
            "steps and telemetry are those written before the launcher died")


def recover_bundle(path: Path) -> Path:
    """Publish the staging folder ``path`` (``OUT/.<bundle_id>.partial``) as a bundle.

    Returns:
        The published bundle directory.

    Raises:
        BundleError: ``path`` is not a staging folder a launcher wrote, or its bundle exists.
        KitInputError: Its launcher, another node's agent or one of its ranks still runs on
            this host.
        OSError: A file could not be written (the staging folder is left as it was).
    """
    staging = BundleStaging.reopen(path)
    if (staging.path / SUMS_NAME).is_file():
        # The launcher died after every file and the checksums were written: finish the job.
        return staging.publish((staging.chunks_dir.name, *SCRATCH))
    for name in (LAUNCHER_FILE, CONFIG_FILE):
        if not (staging.path / name).is_file():
            raise BundleError(f"{path} is not a staging folder a launcher wrote: no {name}")
    try:
        launcher = read_launcher_record(staging.path)
        cfg = read_config(staging.path)
    except ValueError as e:
        raise BundleError(f"{path}: {str(e).splitlines()[0]}") from None
    records = None
    if cfg.nodes > 1:
        from kit.launch.node_merge import read_node_records

        records = read_node_records(staging.path, cfg.nodes)
    _refuse_while_running(staging.path, launcher, records)
    if records is not None:
        return _recover_nodes(staging, cfg, launcher, records)
    why = unpublished_reason(staging.path)
    error = (f"launcher (pid {launcher.pid} on {launcher.host}) could not write the bundle: "
             f"{why}" if why else
             f"launcher was killed (or could not write the bundle): pid {launcher.pid} on "
             f"{launcher.host} ended without publishing it")
    end = RunEnd("failed", error,
                 notes=[_recovered_note(UNSEEN_EXITS), *_elsewhere_note(launcher)])
    return _publish(staging, cfg, launcher, end, read_sampler_report(staging.chunks_dir))


def _publish(staging: BundleStaging, cfg: RunConfig, launcher: LauncherRecord, end: RunEnd,
             report: SamplerReport | None, nodes: list[NodeData] | None = None,
             job: str | None = None) -> Path:
    """Assemble and publish the recovered bundle through the live run's code."""
    why = "no telemetry was recorded before the launcher died" if report is None else (
        "no source read it")
    bundle, _ = assemble_bundle(staging, cfg, launcher.command, end, report, why, nodes, job)
    return bundle


def _elsewhere_note(launcher: LauncherRecord) -> list[str]:
    """A note when the host recovering is not the launcher's.

    The inventory and container recorded are then this host's, not the run's.
    """
    here = socket.gethostname()
    if launcher.host == here:
        return []
    return [f"recovered on {here}, not on {launcher.host} where the run ran: the inventory's host "
            f"facts and the container record are {here}'s"]


def _refuse_while_running(path: Path, launcher: LauncherRecord,
                          records: list[NodeRecord | None] | None) -> None:
    """Refuse while the launcher, another node's agent or a rank of the run runs here.

    ``records`` are the nodes' records of a multi-node run, else None.

    Raises:
        KitInputError: One of them still runs: recovering now would race it.
    """
    alive = launcher.alive()
    if launcher.pid in alive:
        raise KitInputError(f"{path}: its launcher (pid {launcher.pid}) is still running; it "
                            "publishes the bundle itself when it ends")
    for rec in records or ():
        if rec is not None and rec.node != 0 and rec.agent_alive():
            raise KitInputError(
                f"{path}: node {rec.node}'s agent (pid {rec.pid}) is still running; it "
                "ends by itself once its ranks stop or node 0's rendezvous is gone "
                "(within --rdzv-timeout): retry then")
    ranks = sorted(set(alive) | set(running_ranks(path)))
    if ranks:
        raise KitInputError(f"{path}: ranks of the dead launcher still run (pids "
                            f"{', '.join(map(str, ranks))}); they stop within seconds: retry then")


def _recover_nodes(staging: BundleStaging, cfg: RunConfig, launcher: LauncherRecord,
                   records: list[NodeRecord | None]) -> Path:
    """Publish a multi-node staging folder whose node 0 agent died before publishing."""
    from kit.launch.node_merge import node_exits, node_parts, where

    nodes = node_parts(staging.chunks_dir, records, [None] * cfg.nodes)
    ended = [k for k, rec in enumerate(records) if rec is not None and rec.ended]
    silent = [k for k in range(1, cfg.nodes) if k not in ended]  # node 0's death: the headline
    why = unpublished_reason(staging.path)
    error = (f"{where(0, nodes)}: its agent (pid {launcher.pid} on {launcher.host}), which "
             + (f"publishes the bundle, could not write it: {why}" if why else
                "publishes the bundle, was killed (or could not write the bundle) without "
                "publishing it"))
    notes = [_recovered_note("exit codes and times are those the nodes' agents recorded "
                             f"(nodes {', '.join(map(str, ended))})" if ended else UNSEEN_EXITS)]
    if silent:
        notes.append(f"nodes {', '.join(map(str, silent))} recorded no end: their agents died "
                     "too, or ran on until after this recovery")
    notes += [n for k in ended for n in records[k].notes]  # type: ignore[union-attr]
    end = RunEnd("failed", error, node_exits(records, nodes), notes)
    job = next((rec.slurm_job_id for rec in records if rec and rec.slurm_job_id), None)
    return _publish(staging, cfg, launcher, end, nodes[0].report, nodes, job)
