"""Measure a GEMM table (kit.project.gemm): ``torch.matmul`` in the platform's dtype, timed at
every shape the given workloads' layers make under the given TP degrees and micro-batches.

Each shape runs with its pass's operand layout (forward ``x @ w.T``, input gradient
``dy @ w``, weight gradient ``dy.T @ x``) on device 0 (on ``cpu`` the CPU, one thread): three
warm-up calls, then three batches of as many calls as the warm calls' mean says last about
``min_time_s``; the time of one call is the median batch's mean. Inputs are random normal
tensors (a GEMM's speed does not depend on its values).
"""

import platform as host
import statistics
import time
from datetime import datetime, timezone

from kit.errors import KitInputError
from kit.project.gemm import Gemm, GemmPoint, GemmTable, logits_gemms, stage_gemms
from kit.project.request import ProjectionTarget, plan_target
from kit.spec.loader import load_platform, load_workload
from kit.spec.platform import PlatformSpec

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
WARMUP = 3
BATCHES = 3


def layout_gemms(platform: PlatformSpec, workloads: list[str], tps: list[int],
                 micro_batches: list[int]) -> list[Gemm]:
    """The distinct GEMMs (by pass and shape) of every workload x TP x micro-batch, one layer
    and the logits each, resolved as ``run --dry-run`` would on ``platform``.

    Raises:
        KitInputError: An unknown workload, or a TP degree the workload or platform refuses.
    """
    seen: dict[tuple[str, int, int, int], Gemm] = {}
    for name in workloads:
        spec = load_workload(name).model_copy(update={"num_layers": 1})
        for tp in tps:
            for mb in micro_batches:
                target = ProjectionTarget(tp=tp, dp=1, micro_batch_size=mb,
                                          global_batch_size=mb, devices_per_node=(
                                              tp if platform.devices_per_node else None))
                cfg = plan_target(target, spec, platform).cfg
                for g in [*stage_gemms(cfg, 0), *logits_gemms(cfg)]:
                    seen.setdefault(g.shape, g)
    return sorted(seen.values(), key=lambda g: (g.flops, g.shape))


def _time_one(g: Gemm, device: str, dtype: object, min_time_s: float) -> float:
    import torch

    def tensor(rows: int, cols: int) -> "torch.Tensor":
        return torch.randn(rows, cols, device=device, dtype=dtype)  # type: ignore[arg-type]

    if g.pass_ == "forward":
        a, b = tensor(g.m, g.k), tensor(g.n, g.k).t()
    elif g.pass_ == "dgrad":
        a, b = tensor(g.m, g.k), tensor(g.k, g.n)
    else:
        a, b = tensor(g.k, g.m).t(), tensor(g.k, g.n)

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    for _ in range(WARMUP):
        torch.matmul(a, b)
    sync()
    start = time.perf_counter()
    for _ in range(WARMUP):
        torch.matmul(a, b)
    sync()
    one = max((time.perf_counter() - start) / WARMUP, 1e-7)
    calls = max(1, min(1000, int(min_time_s / one)))
    means = []
    for _ in range(BATCHES):
        start = time.perf_counter()
        for _ in range(calls):
            torch.matmul(a, b)
        sync()
        means.append((time.perf_counter() - start) / calls)
    return statistics.median(means)


def measure_gemm_table(platform_name: str, workloads: list[str], tps: list[int],
                       micro_batches: list[int], command: list[str],
                       min_time_s: float = 0.02) -> GemmTable:
    """Time every GEMM of the layouts on this host's device 0 (module docstring).

    Raises:
        KitInputError: Bad names or degrees, or a GPU platform on a host without a GPU.
    """
    import torch

    platform = load_platform(platform_name)
    gemms = layout_gemms(platform, workloads, tps, micro_batches)
    if platform.is_cpu:  # one thread: what one rank of a multi-rank run on a small host gets
        torch.set_num_threads(1)
        device, name = "cpu", f"host CPU ({host.processor() or host.machine()})"
    else:
        if not torch.cuda.is_available():
            raise KitInputError(f"platform {platform.name} needs a GPU and this host has none: "
                                "measure its GEMM table on that GPU (or --platform cpu)")
        device, name = "cuda", torch.cuda.get_device_name(0)
    dtype = getattr(torch, _DTYPES[platform.dtype])
    points = []
    with torch.no_grad():
        for g in gemms:
            t = _time_one(g, device, dtype, min_time_s)
            points.append(GemmPoint(name=g.name, pass_=g.pass_, m=g.m, n=g.n, k=g.k, time_s=t,
                                    tflops=g.flops / t / 1e12))
    return GemmTable(platform=platform.name, device=name, dtype=platform.dtype,
                     created_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     torch_version=torch.__version__, command=command, points=points)
