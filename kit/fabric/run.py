"""Resolve a fabric request into a run config and run it through the training launchers."""

from pathlib import Path

from kit.config.fabric import (
    DEFAULT_SIZES_CPU,
    DEFAULT_SIZES_GPU,
    OPS,
    FabricSpec,
    parse_ops,
    parse_sizes,
)
from kit.config.loader import load_platform
from kit.config.run import OptimizationConfig, ParallelConfig, RunConfig
from kit.errors import KitInputError
from kit.fabric.request import FabricRequest
from kit.launch.launchers import launch_run
from kit.launch.session import SessionResult
from kit.plan.detect import detect_platform, platform_present
from kit.telemetry.devices import local_accelerator_names


def resolve_fabric(req: FabricRequest) -> RunConfig:
    """The run config of the fabric benchmark ``req`` on this host (this node, for many).

    Raises:
        KitInputError: Bad input, or a platform whose devices this host lacks.
    """
    spec = load_platform(req.platform) if req.platform else detect_platform()
    if not platform_present(spec):
        raise KitInputError(f"platform {spec.name} ({spec.device_name}) is not present on this "
                            "host; use --platform cpu")
    if req.launcher == "local" and req.nodes > 1:
        raise KitInputError(f"--nodes {req.nodes} needs --launcher torchrun (with --node-rank "
                            "and --rdzv-endpoint on every node) or --launcher slurm (inside an "
                            "allocation)")
    here = len(local_accelerator_names())
    if spec.is_cpu:
        per_node, devices = req.nproc or 2, None
    else:
        per_node = req.nproc or min(spec.devices_per_node or here, here)
        if per_node > here:
            raise KitInputError(f"--nproc {per_node}: this host has {here} {spec.name} devices")
        devices = per_node
    ranks = per_node * req.nodes
    if ranks < 2:
        raise KitInputError("a collective needs at least 2 ranks: --nproc 2 or more")
    try:
        ops = parse_ops(req.ops) if req.ops else OPS
    except ValueError as e:
        raise KitInputError(f"--ops: {e}") from None
    try:
        sizes = parse_sizes(req.sizes) if req.sizes else (
            DEFAULT_SIZES_CPU if spec.is_cpu else DEFAULT_SIZES_GPU)
    except ValueError as e:
        raise KitInputError(f"--sizes: {e}") from None
    return RunConfig(
        workload=FabricSpec(ops=ops, sizes_bytes=sizes, graph=req.graph), platform=spec,
        nodes=req.nodes, launcher=req.launcher, devices_per_node=devices,
        parallel=ParallelConfig(dp=ranks), optim=OptimizationConfig(), micro_batch_size=1,
        global_batch_size=ranks,
        dtype=spec.dtype, steps=req.iters, warmup=req.warmup,
        telemetry_interval_ms=req.telemetry_interval_ms,
    )


def run_fabric(cfg: RunConfig, req: FabricRequest, out: Path,
               command: list[str], ends_process: bool = False) -> SessionResult | None:
    """Run the benchmark of ``cfg`` with telemetry through its launcher; node 0 publishes the
    bundle under ``out`` (None: a node other than 0 that node 0 did not tell how it ended);
    ``ends_process`` as :func:`kit.launch.launchers.launch_run` takes it."""
    return launch_run(cfg, req, out, command, ends_process=ends_process)
