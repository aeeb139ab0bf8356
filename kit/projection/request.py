"""What a user asks ``charllm-kit project`` for: the target layout, resolved as ``run`` would.

The command's options are generated from :class:`ProjectionTarget` (kit/cli/options.py). The
target is resolved through the same code as ``run --dry-run`` (kit.plan.plan_run), on the
measured runs' platform, so a layout ``run`` refuses is refused here for the same reason; its
memory estimate comes with it.
"""

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, ConfigDict, Field

from kit.config.platform import PlatformSpec
from kit.config.run import Recompute
from kit.config.workload import WorkloadSpec
from kit.errors import KitInputError
from kit.plan.resolve import RunRequest, run_request

if TYPE_CHECKING:
    from kit.plan import RunPlan


_RUN = RunRequest.model_fields
_LAYOUT = frozenset({"tp", "pp", "dp", "cp", "ep", "vpp", "sp", "micro_batch_size",
                     "global_batch_size", "recompute", "overlap", "dist_optimizer"})
"""The fields a target shares with ``run`` (the same names, checks and help)."""


class ProjectionTarget(BaseModel):
    """The layout, scale and batch to project to (defaults: as ``run`` resolves them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: str | None = Field(
        None, description="Target workload (name or YAML): the measured one, or the same "
        "architecture with another number of layers (default: the measured run's).")
    platform: str | None = Field(
        None, description="Platform profile of the target (name or YAML) when it is not the "
        "one the measured runs recorded, e.g. the full node of a run made on part of one; "
        "same platform name (default: the runs' own).")
    nodes: int = Field(1, gt=0, description="Nodes of the platform's devices per node.")
    tp: int = _RUN["tp"]
    pp: int = _RUN["pp"]
    dp: int | None = _RUN["dp"]
    cp: int = _RUN["cp"]
    ep: int = _RUN["ep"]
    vpp: int | None = _RUN["vpp"]
    sp: bool = _RUN["sp"]
    micro_batch_size: int | None = _RUN["micro_batch_size"]
    global_batch_size: int | None = _RUN["global_batch_size"]
    recompute: Recompute = _RUN["recompute"]
    overlap: bool = _RUN["overlap"]
    dist_optimizer: bool = _RUN["dist_optimizer"]
    devices_per_node: int | None = Field(
        None, gt=0, description="Devices used per node, at most the platform's (default: all "
        "of them); fewer projects to part of a host, as runs on a partial host use.")


def _spec_file(folder: Path, name: str, spec: WorkloadSpec | PlatformSpec) -> str:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False),
                    encoding="utf-8")
    return str(path)


def plan_target(target: ProjectionTarget, workload: WorkloadSpec,
                platform: PlatformSpec) -> "RunPlan":
    """Resolve ``target`` on ``platform`` (the measured run's profile, as recorded).

    ``workload`` is the measured run's, used when the target names none.

    Raises:
        KitInputError: The layout is impossible or refused (as ``run --dry-run``), or more
            devices per node than the platform has.
    """
    from kit.plan import plan_run  # memory estimates: only when a projection runs

    per_node = target.devices_per_node
    if per_node is not None:
        full = platform.devices_per_node
        if full is None or per_node > full:
            raise KitInputError(f"--devices-per-node {per_node}: platform {platform.name} has "
                                f"{full or 'no fixed number of'} devices per node")
        platform = platform.model_copy(update={
            "devices_per_node": per_node,
            "chassis": [c for c in platform.chassis if c.device < per_node]})
    with tempfile.TemporaryDirectory(prefix="charllm-project-") as tmp:
        folder = Path(tmp)
        platform_file = _spec_file(folder, platform.name, platform)
        workload_ref = target.workload or _spec_file(folder, "measured-workload", workload)
        req = run_request(
            workload=workload_ref, platform=platform_file, nodes=target.nodes,
            launcher="local" if target.nodes == 1 else "slurm",
            **target.model_dump(include=set(_LAYOUT)))
        return plan_run(req, require_present=False)
