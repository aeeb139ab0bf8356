"""Measure a GEMM table (kit.projection.gemm): ``torch.matmul`` in the platform's dtype, timed at
every shape the given workloads' layers make under the given TP degrees and micro-batches.

Each shape runs with its pass's operand layout (forward ``x @ w.T``, input gradient
``dy @ w``, weight gradient ``dy.T @ x``) on device 0 (on ``cpu`` the CPU, one thread): three
warm-up calls, then three batches of as many calls as the warm calls' mean says last about
``min_time_s``; the time of one call is the median batch's mean. Inputs are random normal
tensors (a GEMM's speed does not depend on its values).

Before timing, the expected seconds of every shape are estimated from one probe GEMM's rate
(:func:`expected_s`) and said, as is progress with the time left while it runs. Without TP
degrees given, the defaults are those of :data:`TP_CHOICES` the workloads' heads and the
platform's node allow; a CPU host refuses a default set it would take longer than
:data:`CPU_BUDGET_S` to time (a big model's shapes on one thread take hours), naming a way out.
"""

import platform as host
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone

from kit.config.loader import load_platform, load_workload
from kit.config.platform import PlatformSpec
from kit.errors import KitInputError
from kit.projection.gemm import Gemm, GemmPoint, GemmTable, logits_gemms, stage_gemms
from kit.projection.request import ProjectionTarget, plan_target

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
WARMUP = 3
BATCHES = 3
TP_CHOICES = (1, 2, 4, 8)
"""TP degrees timed by default, where the workload and platform allow them (default_tps)."""
MICRO_BATCHES = (1, 2)
"""Micro-batch sizes timed by default."""
CPU_BUDGET_S = 300.0
"""Longest expected timing a CPU host starts with the default shapes (its table only serves
projections of CPU runs)."""
PROGRESS_EVERY_S = 5.0
"""Seconds between two progress lines (the first and last shapes always have one)."""
PROBE = (512, 512, 512)
"""``m, n, k`` of the GEMM whose rate the estimate starts from."""


def default_tps(platform: PlatformSpec, workloads: list[str]) -> list[int]:
    """The degrees of :data:`TP_CHOICES` that divide every workload's attention heads and
    key/value groups and fit the platform's node.

    Raises:
        KitInputError: An unknown workload.
    """
    specs = [load_workload(name) for name in workloads]
    per_node = platform.devices_per_node
    return [tp for tp in TP_CHOICES
            if (per_node is None or tp <= per_node)
            and all(w.num_attention_heads % tp == 0 and w.query_groups % tp == 0 for w in specs)]


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


def expected_s(g: Gemm, flops_per_s: float, min_time_s: float) -> float:
    """Seconds :func:`_time_one` should take for ``g`` at ``flops_per_s``: its warm-up calls,
    then its batches of at least ``min_time_s`` (or one call each)."""
    one = g.flops / flops_per_s
    return 2 * WARMUP * one + BATCHES * max(min_time_s, one)


def _probe_rate(device: str, dtype: object) -> float:
    """FLOP/s of the :data:`PROBE` GEMM (the estimate's starting rate)."""
    m, n, k = PROBE
    probe = Gemm("probe", "forward", m, n, k, 1)
    return probe.flops / _time_one(probe, device, dtype, 0.0)


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def measure_gemm_table(platform_name: str, workloads: list[str], tps: list[int] | None,
                       micro_batches: list[int] | None, command: list[str],
                       min_time_s: float = 0.02,
                       say: Callable[[str], None] = lambda line: None) -> GemmTable:
    """Time every GEMM of the layouts on this host's device 0 (module docstring); ``tps`` and
    ``micro_batches`` None take the defaults. ``say`` gets the estimate and progress lines.

    Raises:
        KitInputError: Bad names or degrees, a GPU platform on a host without a GPU, or on
            a CPU host default shapes that would take longer than :data:`CPU_BUDGET_S`.
    """
    import torch

    platform = load_platform(platform_name)
    defaults = tps is None and micro_batches is None
    tps = default_tps(platform, workloads) if tps is None else tps
    micro_batches = list(MICRO_BATCHES) if micro_batches is None else micro_batches
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
    what = (f"{len(gemms)} GEMM shapes of {', '.join(workloads)} at TP {tps} x micro-batch "
            f"{micro_batches} ({sum(g.flops for g in gemms) / 1e12:.3g} TFLOP one call of each)")
    points = []
    with torch.no_grad():
        rate = _probe_rate(device, dtype)
        expected = [expected_s(g, rate, min_time_s) for g in gemms]
        if platform.is_cpu and defaults and sum(expected) > CPU_BUDGET_S:
            raise KitInputError(
                f"timing {what} on one CPU thread would take about {_duration(sum(expected))}: "
                "a CPU host's GEMM table only serves projections of CPU runs; time a small "
                "workload (--workload gpt3-tiny), name the shapes (--tp 1 --micro-batch 1), or "
                "run this on the GPU kind whose table you want")
        say(f"timing {what} on {name}: about {_duration(sum(expected))}")
        start = last = time.monotonic()
        for i, g in enumerate(gemms):
            t = _time_one(g, device, dtype, min_time_s)
            points.append(GemmPoint(name=g.name, pass_=g.pass_, m=g.m, n=g.n, k=g.k, time_s=t,
                                    tflops=g.flops / t / 1e12))
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S or i + 1 == len(gemms):
                last = now
                pace = (now - start) / sum(expected[: i + 1])  # measured / expected so far
                left = pace * sum(expected[i + 1:])
                say(f"{i + 1}/{len(gemms)} shapes timed in {_duration(now - start)}"
                    + (f", about {_duration(left)} left" if i + 1 < len(gemms) else ""))
    return GemmTable(platform=platform.name, device=name, dtype=platform.dtype,
                     created_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     torch_version=torch.__version__, command=command, points=points)
