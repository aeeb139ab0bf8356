"""Which launcher runs a resolved config: one node locally, or this node's part of many."""

import os
import sys
from pathlib import Path
from typing import Protocol

from kit.config.run import RunConfig
from kit.launch.session import SessionResult


class NodePlace(Protocol):
    """Where this process sits in a multi-node run: the options ``run`` and ``fabric`` share."""

    node_rank: int | None
    rdzv_endpoint: str | None
    rdzv_timeout: int


def launch_run(cfg: RunConfig, place: NodePlace, out: Path, command: list[str],
               ends_process: bool = False) -> SessionResult | None:
    """Run ``cfg`` with the launcher it names and return how it ended.

    The platform's ``env`` is set first where the environment does not set it, so every rank
    gets it, as under ``submit``'s sbatch script. Each rank runs its run kind's worker module
(kit.config.run_kind: training or the fabric benchmark).

    ``local`` runs every rank here (kit.launch.session). ``torchrun`` runs this node's part
    (kit.launch.node_session), with the node's place from ``--node-rank`` and
    ``--rdzv-endpoint``; ``slurm`` starts one such agent per node with srun and exits with
    srun's code (kit.launch.slurm), and in each srun task is that node's agent. None: a node
    other than 0 that node 0 did not tell how the run ended.

    ``ends_process``: the process exits once this run is said (a CLI command, not a sweep):
    SIGINT/SIGTERM stay counted from staging on and are ignored after publication, so a late
    stop request cannot change its exit code (kit.launch.signals).

    Raises:
        KitInputError: Missing or bad node options, a node that did not join, an output folder
            that is not shared.
    """
    for key, value in cfg.platform.env.items():  # what the user exported wins
        os.environ.setdefault(key, value)
    if cfg.launcher == "local":
        from kit.launch.session import run_session

        return run_session(cfg, out, command, ends_process=ends_process)
    from kit.launch.node_session import run_node_session

    if cfg.launcher == "slurm":
        from kit.launch import slurm

        if os.environ.get(slurm.AGENT_ENV) != "1":  # the command itself: start the agents
            sys.exit(slurm.start_agents(cfg.nodes, command))  # signals ignored from srun's end
        role = slurm.slurm_role(cfg.nodes, place.rdzv_timeout)
    else:
        from kit.launch.rendezvous import torchrun_role

        role = torchrun_role(place.node_rank, cfg.nodes, place.rdzv_endpoint,
                             place.rdzv_timeout)
    return run_node_session(cfg, out, command, role, ends_process)
