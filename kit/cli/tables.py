"""Human-readable tables for the CLI: workloads, platforms, dry runs and run summaries."""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kit.config.loader import load_platform, load_workload, platform_names, workload_names
from kit.config.run import ParallelConfig, RunConfig
from kit.config.workload import WorkloadSpec
from kit.engines import engine_spec
from kit.metrics.flops import model_flops_per_step, params_count
from kit.metrics.text import fmt
from kit.neutralize import safe_table, terminal_safe
from kit.plan.memory import GIB, MemoryEstimate, fit_refusal, fit_warning

if TYPE_CHECKING:
    from kit.launch.session import SessionResult


def count_text(n: int) -> str:
    """A count with the largest suffix that keeps it at 1 or more: ``175B``, ``941K``."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return str(n)


def workloads_table() -> str:
    """One row per shipped workload."""
    rows = []
    for name in workload_names():
        w = load_workload(name)
        moe = f"{w.num_experts}x top-{w.moe_top_k}" if w.is_moe else "-"
        rows.append([name, w.family, count_text(params_count(w)), w.num_layers,
                     w.hidden_size, f"{w.num_attention_heads}/{w.query_groups}", w.seq_length, moe])
    return safe_table(rows, headers=["workload", "family", "params", "layers", "hidden",
                                    "heads/groups", "seq", "MoE"])


def _unused_fields(w: WorkloadSpec) -> set[str]:
    """Fields that do not apply to this architecture: MoE routing of a dense model, RoPE's base
    without RoPE."""
    unused = set() if w.is_moe else {"num_experts", "moe_top_k", "moe_capacity_factor",
                                          "moe_pad_to_capacity"}
    if w.position_embedding != "rope":
        unused.add("rope_theta")
    return unused


def show_workload(name: str) -> str:
    """Every field of one workload that applies to it, plus its size and FLOPs per token."""
    w = load_workload(name)
    unused = _unused_fields(w)
    rows = [[k, v] for k, v in w.model_dump().items() if k not in unused]
    rows.append(["parameters", f"{params_count(w):,}"])
    per_token = model_flops_per_step(w, 1) / w.seq_length
    rows.append(["model FLOPs per token (fwd+bwd)", f"{per_token:.4g}"])
    return safe_table(rows, tablefmt="plain")


def platforms_table() -> str:
    """One row per shipped platform."""
    rows = []
    for name in platform_names():
        p = load_platform(name)
        peak = p.peak_tflops.get(p.dtype)
        rows.append([name, p.vendor, p.device_name, fmt(p.devices_per_node),
                     fmt(p.memory_per_device_gib, " GiB"), p.dtype, fmt(peak), p.comm_backend,
                     ",".join(p.telemetry)])
    return safe_table(rows, headers=["platform", "vendor", "device", "per node", "memory",
                                    "dtype", "peak TFLOP/s", "comm", "telemetry"])


def show_platform(name: str) -> str:
    """One platform profile as YAML-like text."""
    import yaml

    return yaml.safe_dump(load_platform(name).model_dump(mode="json"), sort_keys=False)


def layout_line(p: ParallelConfig) -> str:
    """The degrees, with ``vpp`` only when the pipeline is interleaved."""
    vpp = f" vpp={p.vpp}" if p.vpp is not None else ""
    return f"tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} ep={p.ep}{vpp} sp={p.sp}"


def resolved_summary(cfg: RunConfig) -> str:
    """The resolved run: workload (and scaling), layout, batch and step counts."""
    p, o = cfg.parallel, cfg.optim
    rows = [
        ["workload", cfg.workload.name],
        ["platform", f"{cfg.platform.name} ({cfg.platform.device_name})"],
        ["engine", cfg.engine],
        ["world size", cfg.world_size],
        ["layout", layout_line(p)],
        ["batch", f"micro {cfg.micro_batch_size} x accum {cfg.grad_accum_steps} x dp {p.dp} "
                  f"= global {cfg.global_batch_size} ({cfg.tokens_per_step} tokens)"],
        ["optimizations", f"recompute={o.recompute} overlap={o.overlap} "
                          + engine_spec(cfg.engine).options_summary(cfg)],
        ["step execution", engine_spec(cfg.engine).execution(cfg).describe()],
        ["dtype", cfg.dtype],
        ["steps", f"{cfg.warmup} warmup + {cfg.steps} measured"],
        ["parameters", f"{params_count(cfg.workload):,}"],
        ["model FLOPs per step",
         f"{model_flops_per_step(cfg.workload, cfg.global_batch_size, p.tp):.4g}"],
    ]
    if cfg.scaling:
        changed = ", ".join(f"{k} {getattr(cfg.scaling.original, k)}->{v}"
                            for k, v in cfg.scaling.rule.set.items())
        rows.insert(1, ["scaled from", f"{cfg.scaling.original.name} ({changed}; "
                                       f"{cfg.scaling.rule.reason})"])
    return safe_table(rows, tablefmt="plain")


def memory_table(est: MemoryEstimate) -> str:
    """The memory estimate of the stage that peaks, in GiB, and the fit verdict on one line."""
    s = est.peak
    rows = [
        ["weights", s.weights_bytes], ["gradients", s.grads_bytes],
        ["optimizer states", s.optimizer_bytes],
        [f"activations ({s.micro_batches_in_flight} in flight)", s.activations_bytes],
        ["logits", s.logits_bytes], ["framework overhead", s.overhead_bytes],
        ["total per device", s.total_bytes],
    ]
    title = f"memory estimate, pipeline stage {s.stage} of {len(est.stages)}"
    table = safe_table([[k, v / GIB] for k, v in rows], headers=[title, "GiB"],
                       floatfmt=".2f")
    if est.fits is None:
        verdict = [f"memory: no capacity declared ({est.capacity_source}); not checked"]
    elif est.fits:
        verdict = [f"memory: fits {est.capacity_bytes / GIB:.1f} GiB {est.capacity_source} "
                   f"(headroom {est.headroom_bytes / GIB:.1f} GiB)"]
        warning = fit_warning(est)
        verdict += [f"warning: {warning}"] if warning else []
    else:
        verdict = [f"memory: would not fit; run refuses it: {fit_refusal(est)}"]
    return "\n".join([table, *map(terminal_safe, verdict)])  # the source names the device


def print_dry_run(cfg: RunConfig, as_json: bool, memory: MemoryEstimate | None = None) -> None:
    """Print the resolved config and memory estimate (JSON with ``--json``)."""
    if as_json:
        out = cfg.model_dump(mode="json")
        out["execution"] = engine_spec(cfg.engine).execution(cfg).as_json()
        if memory is not None:
            out["memory_estimate"] = memory.model_dump(mode="json")
        print(json.dumps(out, indent=2))
    else:
        print(resolved_summary(cfg))
        if memory is not None:
            print(memory_table(memory))
        refused = memory is not None and fit_refusal(memory) is not None
        print("dry run: valid, but run refuses it unless --force (memory); nothing launched"
              if refused else "dry run: valid; nothing launched")


SUMMARY_ROWS = [
    ("step time", "step_time_s", " s"),
    ("tokens/s", "tokens_per_s", ""),
    ("TFLOP/s per device", "tflops_per_gpu", ""),
    ("MFU", "mfu", ""),
    ("peak memory per rank", "mem_peak_gib", " GiB"),
    ("mean power", "power_w_mean", " W"),
    ("peak power", "power_w_peak", " W"),
    ("energy per token", "energy_j_per_token", " J"),
    ("max temperature", "temp_gpu_c_max", " C"),
]


def summary_table(summary: dict[str, Any]) -> str:
    """The canonical summary metrics, ``n/a`` where the host cannot measure them."""
    rows = []
    for label, key, unit in SUMMARY_ROWS:
        v = summary.get(key)
        rows.append([label, f"{v:.1%}" if key == "mfu" and v is not None else fmt(v, unit, 4)])
    return safe_table(rows, tablefmt="simple", headers=["metric", "value"])


def print_summary(result: "SessionResult") -> None:
    """Print a finished run's status and summary table (the bundle path follows)."""
    print(f"status: {result.status}" + (f" ({result.error})" if result.error else ""))
    print(summary_table(result.summary))
    if result.timing:
        print(f"time outside the steps: {result.timing}")
    if result.compile_cache:
        print(f"compile cache: {compile_cache_state(result.compile_cache)}, "
              f"{result.compile_cache['dir']}")
    profiled = profile_line(result.bundle.resolve())
    if profiled:
        print(profiled)


def profile_line(bundle: Path) -> str | None:
    """One line on a profiled run's breakdown: how many ranks, each stage's measured bubble
    against the analytical one, and where to see the rest; None without a profile."""
    from kit.analysis.side_by_side import profile_shares
    from kit.bundle.reader import read_bundle

    shares = profile_shares([read_bundle(bundle)])
    if not shares:
        return None
    line = f"profile: time by category on {len(shares)} profiled rank(s)"
    bubbles = [s for s in shares if s["bubble_measured"] is not None]
    if bubbles:
        line += "; pipeline bubble " + ", ".join(
            f"stage {s['stage']} {s['bubble_measured']:.1%}" for s in bubbles)
        line += f" (analytical {bubbles[0]['bubble_analytical']:.1%})"
    return f"{line}: charllm-kit bundle show {bundle}"


def compile_cache_state(used: dict[str, Any]) -> str:
    """How a run left the compile cache (kit.cache.compile_cache.prepare's record): ``warm``, or
    what it compiled into it; a run that compiled nothing (a CPU run: no inductor or Triton
    kernels) says so rather than claim it fills the cache."""
    from kit.cache.compile_cache import entries

    if used["warm"]:
        return "warm"
    added = entries(Path(used["dir"])) - used["entries_before"]
    return (f"cold, this run compiled {added} artifacts into it" if added > 0
            else "unused, this run compiled nothing")


def next_steps(bundle: Path) -> str:
    """What to do with a run's bundle next, as its user types it (``./run.sh`` when run.sh
    started this process): show it, and write a report on it."""
    from kit.lifecycle import started_by_run_sh

    kit = "./run.sh" if started_by_run_sh() else "charllm-kit"
    return (f"next: {kit} bundle show {bundle}   # the run again, per stage\n"
            f"      {kit} report {bundle} -o report.html   # figures and checks, in a browser")


def how_to_open(report: Path, markdown: bool, single_file: bool) -> str:
    """How to read a written report: its figures' folder goes with it unless inlined."""
    figures = f"{report.stem}_figures/"
    if markdown:
        return (f"a Markdown report: read it in a Markdown viewer, with its figures in "
                f"{figures} beside it")
    with_figures = ("" if single_file else
                    f" (its figures are in {figures} beside it: copy both, or write it with "
                    "--single-file)")
    return f"open it in a web browser: {report.as_uri()}{with_figures}"
