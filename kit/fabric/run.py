"""Resolve a fabric request into a run config and run it through the training launcher."""

from pathlib import Path

from kit.errors import KitInputError
from kit.fabric.spec import (
    DEFAULT_SIZES_CPU,
    DEFAULT_SIZES_GPU,
    OPS,
    CollectiveOp,
    FabricSpec,
    parse_sizes,
)
from kit.launch.session import SessionResult, run_session
from kit.spec.detect import detect_platform, local_accelerator_names, platform_present
from kit.spec.loader import load_platform
from kit.spec.run import OptimizationConfig, ParallelConfig, RunConfig

WORKER = "kit.fabric.worker"


def resolve_fabric(
    platform: str | None = None,
    nproc: int | None = None,
    nodes: int = 1,
    sizes: str | None = None,
    ops: tuple[CollectiveOp, ...] = OPS,
    iters: int = 20,
    warmup: int = 5,
    telemetry_interval_ms: int = 20,
) -> RunConfig:
    """The run config of a fabric benchmark on this host.

    Args:
        platform: Platform name or YAML; None detects this host.
        nproc: Ranks per node; default 2 on cpu, else every device of the node.
        nodes: Nodes; more than one is refused until multi-node launch exists.
        sizes: Comma-separated sizes (``4K,1M``); default per platform (kit.fabric.spec).
        ops: Collectives to measure.
        iters: Timed operations per point.
        warmup: Untimed operations before them.
        telemetry_interval_ms: Sampling period; 0 turns telemetry off.

    Raises:
        KitInputError: Bad input, or a platform whose devices this host lacks.
    """
    spec = load_platform(platform) if platform else detect_platform()
    if not platform_present(spec):
        raise KitInputError(f"platform {spec.name} ({spec.device_name}) is not present on this "
                            "host; use --platform cpu")
    if nodes > 1:
        raise KitInputError(f"--nodes {nodes}: fabric starts ranks on this node only (multi-node "
                            "launch through torchrun or Slurm is not available yet)")
    here = len(local_accelerator_names())
    if spec.is_cpu:
        ranks, per_node = nproc or 2, None
    else:
        ranks = nproc or min(spec.devices_per_node or here, here)
        if ranks > here:
            raise KitInputError(f"--nproc {ranks}: this host has {here} {spec.name} devices")
        per_node = ranks
    if ranks < 2:
        raise KitInputError("a collective needs at least 2 ranks: --nproc 2 or more")
    try:
        chosen = parse_sizes(sizes) if sizes else (
            DEFAULT_SIZES_CPU if spec.is_cpu else DEFAULT_SIZES_GPU)
    except ValueError as e:
        raise KitInputError(f"--sizes: {e}") from None
    return RunConfig(
        workload=FabricSpec(ops=ops, sizes_bytes=chosen), platform=spec, nodes=nodes,
        devices_per_node=per_node, parallel=ParallelConfig(dp=ranks), optim=OptimizationConfig(),
        micro_batch_size=1, global_batch_size=ranks, dtype=spec.dtype, steps=iters,
        warmup=warmup, telemetry_interval_ms=telemetry_interval_ms,
    )


def run_fabric(cfg: RunConfig, out: Path, command: list[str]) -> SessionResult:
    """Run the benchmark of ``cfg`` with telemetry and publish its bundle under ``out``."""
    return run_session(cfg, out, command, worker=WORKER)
