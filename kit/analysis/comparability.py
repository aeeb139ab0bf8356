"""Say what makes bundles hard to compare, so a table is never read as like for like by mistake.

Checks, each over all compared bundles (from ``manifest.json`` and ``metrics.json`` only):

* ``unverified``: a bundle that failed verification, used only because of
  ``--allow-unverified``: its files may have been edited since the run wrote them.
* ``workload``: different architectures (the fields that differ are named), or different
  workload names of one architecture (fabric benchmarks, which train none, left out).
* ``scaled``: a workload scaled down by a platform rule: the original, the rule's changes and
  its reason, as the manifest records them.
* ``platform``: different platforms (MFU is then against each platform's own peak), or one
  platform name over different devices (the inventories' GPU models).
* ``engine``: different training engines (megatron-core, DeepSpeed), with their versions;
  fabric benchmarks, which train nothing, are left out.
* ``software``: one engine in different versions, or different torch, CUDA/ROCm or driver
  versions.
* ``precision``, ``batch``, ``sequence``: different dtype, micro or global batch, or sequence
  length (fabric benchmarks have no batch: left out).
* ``execution``: steps replayed from a CUDA graph in some runs and run eagerly in others (the
  bundle's ``execution``, or its engine's notes in older bundles): the host's share of a step
  differs, and with it speed and power.
* ``telemetry``: energy from a hardware counter in some runs and from integrated power in
  others, or power from different backends.
* ``schema``: different bundle schema versions.
* ``status``: a run that failed, ran out of memory or was interrupted; ``partial``: a run that
  ended ok but measured fewer steps than it was asked to.
* ``image``: the container images the runs ran in, by content digest: the same image in all
  (a match, said so that two sites can see they ran one software stack) or not.
* ``projected``: a projection (``charllm-kit project``) among them: a model's figures, with
  the bundles it was projected from.
* ``swept``: the axes a sweep or study varies on purpose (``swept``), with their values. A
  difference there is what the runs set out to measure, not a flaw of the comparison, so the
  check it would raise (``batch``, ``precision``, ``engine``, ``platform``, ``workload``,
  ``sequence``, ``execution`` for the ``eager`` axis) is left out and this one line says
  instead that the axis is swept.
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from kit.bundle.reader import Bundle
from kit.config.run_kind import run_kind
from kit.engines import ENGINES
from kit.engines.execution import execution_of
from kit.metrics.text import shorten
from kit.projection.file import projection_of

_NOT_ARCHITECTURE = frozenset(
    {"name", "family", "description", "scaling", "micro_batch_size", "global_batch_size"}
)
_NAMED = 3
"""Bundles named in a message before the rest are counted."""
UNRECORDED_MODE = "mode unrecorded"
"""The execution mode of a bundle that records neither the field nor the engine's notes."""
_ERROR_WIDTH = 160
"""Characters of a failed run's error a ``status`` check quotes (its first line, shortened)."""


@dataclass(frozen=True)
class Check:
    """One comparability finding: its kind (see the module docstring) and a one-line message."""

    kind: str
    message: str


def _names(bundles: list[Bundle]) -> str:
    """Bundle ids, the first few by name and the rest counted."""
    ids = [b.path.name for b in bundles]
    more = f" and {len(ids) - _NAMED} more" if len(ids) > _NAMED else ""
    return ", ".join(ids[:_NAMED]) + more


def _by_value(bundles: list[Bundle], value: Callable[[Bundle], Any]) -> dict[str, list[Bundle]]:
    """Bundles by the string form of ``value(bundle)``, in first-seen order; None left out."""
    out: dict[str, list[Bundle]] = {}
    for b in bundles:
        v = value(b)
        if v is not None:
            out.setdefault(str(v), []).append(b)
    return out


def _differs(kind: str, what: str, bundles: list[Bundle],
             value: Callable[[Bundle], Any]) -> list[Check]:
    """A check when ``value`` takes more than one value over ``bundles``."""
    groups = _by_value(bundles, value)
    if len(groups) < 2:
        return []
    parts = [f"{v} ({len(bs)}: {_names(bs)})" for v, bs in groups.items()]
    return [Check(kind, f"different {what}: " + "; ".join(parts))]


def recorded_mode(bundle: Bundle) -> str | None:
    """``graphed`` or ``eager`` as the bundle records it (kit.engines.execution), else None."""
    found = execution_of(bundle.metrics.execution, bundle.metrics.notes)
    return found.mode if found is not None else None


def execution_mode(bundle: Bundle) -> str:
    """:func:`recorded_mode`, or :data:`UNRECORDED_MODE` where the bundle records none."""
    return recorded_mode(bundle) or UNRECORDED_MODE


def _architecture(bundle: Bundle) -> dict[str, Any]:
    return {k: v for k, v in bundle.manifest.workload.items() if k not in _NOT_ARCHITECTURE}


def _workload_checks(bundles: list[Bundle]) -> list[Check]:
    """Different architectures (naming the fields) or names."""
    checks = []
    arch = {b.manifest.workload["name"]: _architecture(b) for b in bundles}
    fields = sorted({k for a in arch.values() for k in a
                     if len({repr(x.get(k)) for x in arch.values()}) > 1})
    if fields:
        shown = fields[:6]
        per = "; ".join(f"{name}: " + " ".join(f"{k}={a.get(k)}" for k in shown)
                        for name, a in arch.items())
        more = f" (and {len(fields) - len(shown)} more fields)" if len(fields) > len(shown) else ""
        checks.append(Check("workload", f"different workload architectures{more}: {per}"))
    elif len(arch) > 1:
        checks.append(Check("workload", "different workload names of one architecture: "
                                        + ", ".join(arch)))
    return checks


def _scaled_checks(bundles: list[Bundle]) -> list[Check]:
    """Every scaled variant's platform rule, once per workload."""
    checks = []
    seen = set()
    for b in bundles:
        scaling, name = b.manifest.workload.get("scaling"), b.manifest.workload["name"]
        if not scaling or name in seen:
            continue
        seen.add(name)
        original, rule = scaling.get("original", {}), scaling.get("rule", {})
        changes = ", ".join(f"{k} {original.get(k, '?')}->{v}"
                            for k, v in rule.get("set", {}).items())
        checks.append(Check(
            "scaled",
            f"{name} is a scaled variant of {original.get('name', '?')} by the "
            f"{scaling.get('platform', '?')} platform rule ({changes}: {rule.get('reason', '')}); "
            f"bundles: {_names([x for x in bundles if x.manifest.workload['name'] == name])}",
        ))
    return checks


def energy_source(bundle: Bundle) -> str | None:
    """``counter``, ``integrated power`` or ``mixed``: where the run's energy came from."""
    metrics = bundle.metrics
    if metrics.summary.get("energy_j_per_token") is None:
        return None
    source = metrics.power.get("energy_source")
    if source is None:  # bundles written before metrics.json had a 'power' section
        source = next((n.split(":", 1)[1].strip() for n in metrics.notes
                       if n.startswith("energy:")), None)
    if source is None:
        return "unrecorded"
    return "counter" if "counter" in source else source


def power_source(bundle: Bundle) -> str | None:
    """The backend that fed the run's power: GPU ``power_w`` (instantaneous), else GPU
    ``power_avg_w`` (averaged, e.g. MI250), else host ``cpu_power_w``."""
    if bundle.metrics.summary.get("power_w_mean") is None:
        return None
    sources = bundle.manifest.telemetry_sources
    for name in ("power_w", "power_avg_w", "cpu_power_w"):
        src = s.source if (s := sources.get(name)) else None
        if src:
            return f"{src} {name}"
    return "unrecorded"


def _status_checks(bundles: list[Bundle]) -> list[Check]:
    """Runs that did not end ok, and ok runs with fewer measured steps than asked for; runs
    that ended the same way (one status and error, or one shortfall) share one line."""
    ended: dict[tuple[str, str], list[Bundle]] = {}
    short: dict[tuple[int, int], list[Bundle]] = {}
    for b in bundles:
        m = b.manifest
        if m.status != "ok":
            error = shorten((m.error or "no error recorded").splitlines()[0], _ERROR_WIDTH)
            ended.setdefault((m.status, error), []).append(b)
            continue
        if m.workload.get("family") == "fabric":  # iterations per size, not steps
            continue
        asked = m.config.get("steps")
        done = [r.get("measured_steps") for r in b.metrics.per_rank]
        done = [d for d in done if isinstance(d, int)]
        if asked and done and min(done) < asked:
            short.setdefault((min(done), asked), []).append(b)

    def who(same: list[Bundle]) -> str:
        workloads = ", ".join(dict.fromkeys(b.manifest.workload["name"] for b in same))
        return f"{_names(same)} ({workloads})"

    checks = [Check("status", f"{who(same)} ended {status}: {error}; "
                              + ("its figures cover a partial run" if len(same) == 1 else
                                 f"{len(same)} runs whose figures cover partial runs")
                              + " and are kept apart from successful repeats")
              for (status, error), same in ended.items()]
    checks += [Check("partial", f"{_names(same)} ended ok but measured {done} of {asked} steps")
               for (done, asked), same in short.items()]
    return checks


def _unverified_checks(bundles: list[Bundle]) -> list[Check]:
    """Bundles used although they failed verification, with what failed."""
    return [Check("unverified", f"{b.path.name} failed verification ({b.verification_error}) "
                                "and is used only because of --allow-unverified: its figures "
                                "may have been edited")
            for b in bundles if b.verification_error is not None]


def _image_checks(bundles: list[Bundle]) -> list[Check]:
    """One image in all runs (only a digest proves it), or which image each run had."""
    def identity(b: Bundle) -> str:
        c = b.manifest.container
        if c is None:
            return "no container recorded"
        built = f"{c.flavour or 'no'} flavour, revision {c.revision or '?'}"  # -dirty too
        if c.digest:  # the image's own properties only: sites may name it differently
            return f"{c.digest[:19]} ({built})"
        return f"{c.image or 'an unnamed image'} ({built}), digest unknown"

    records = [b.manifest.container for b in bundles]
    digests = {c.digest if c else None for c in records}
    if len(digests) == 1 and None not in digests:
        name = records[0].image if records[0] else None
        return [Check("image", f"same image in all {len(bundles)} runs: {identity(bundles[0])}"
                               + (f", run as {name}" if name else ""))]
    if not any(records):
        return []
    return _differs("image", "or unidentified container images", bundles, identity)


def _projected_checks(bundles: list[Bundle]) -> list[Check]:
    """Projections, each with the bundles it scaled."""
    return [Check("projected", f"{b.path.name} is PROJECTED, not measured (kit.projection), from "
                  + ", ".join(f"{i.bundle} ({i.role})" for i in p.inputs if i.role != "unused"))
            for b in bundles if (p := projection_of(b)) is not None]


def _engine(b: Bundle) -> str:
    """The run's engine and its installed version, e.g. ``megatron (megatron-core 0.16.1)``
    (the first package its spec trains with; an engine this kit does not know: its name)."""
    engine = b.manifest.config.get("engine", "megatron")
    spec = ENGINES.get(engine)
    package = spec.packages[0] if spec is not None and spec.packages else engine
    versions = {v for n in b.manifest.inventory
                if (v := n.engine_versions.get(package)) is not None}
    return f"{engine} ({package} {', '.join(sorted(versions)) or 'version unrecorded'})"


def _devices(b: Bundle) -> str | None:
    """GPU models of the run's nodes, e.g. ``NVIDIA H200``; None without GPUs."""
    names = sorted({str(g.get("name")) for n in b.manifest.inventory for g in n.gpus})
    return ", ".join(names) or None


def _software(b: Bundle) -> str:
    """torch, CUDA or ROCm and driver of the run's nodes (node 0's when they agree)."""
    nodes = {(n.torch, n.cuda, n.rocm, n.driver) for n in b.manifest.inventory}
    parts = []
    for torch, cuda, rocm, driver in sorted(nodes, key=str):
        parts.append(" ".join(x for x in (f"torch {torch}", cuda and f"CUDA {cuda}",
                                          rocm and f"ROCm {rocm}",
                                          driver and f"driver {driver}") if x))
    return " / ".join(parts)


def _software_checks(bundles: list[Bundle]) -> list[Check]:
    """One engine in several versions, or different torch/CUDA/ROCm/driver versions."""
    by_engine: dict[str, list[Bundle]] = {}
    for b in bundles:
        by_engine.setdefault(b.manifest.config.get("engine", "megatron"), []).append(b)
    checks = []
    for same in by_engine.values():
        checks += _differs("software", "engine versions", same, _engine)
    return checks + _differs("software", "torch, CUDA/ROCm or driver versions", bundles,
                             _software)


def axis_value(bundle: Bundle, axis: str) -> Any:
    """The value a run had on a sweep axis (a ``charllm-kit run`` field: ``tp``,
    ``micro_batch_size``, ``recompute``, ``workload``...), from its resolved config; None when
    the config does not hold it."""
    m = bundle.manifest
    if axis in ("workload", "platform"):
        return (m.workload if axis == "workload" else m.platform).get("name")
    for part in (m.config.get("parallel") or {}, m.config.get("optim") or {}, m.config):
        if axis in part:
            return part[axis]
    return None


def _swept_check(bundles: list[Bundle], swept: Collection[str]) -> list[Check]:
    """One line naming the swept axes the bundles differ on, with their values."""
    parts = []
    for axis in swept:
        values = list(dict.fromkeys(str(v) for b in bundles
                                    if (v := axis_value(b, axis)) is not None))
        if len(values) > 1:
            parts.append(f"{axis} {', '.join(values)}")
    if not parts:
        return []
    return [Check("swept", "the swept axes, varied on purpose (so not flagged as differences): "
                           + "; ".join(parts))]


def comparability_checks(bundles: list[Bundle], swept: Collection[str] = ()) -> list[Check]:
    """Everything that makes ``bundles`` not like for like (module docstring), in that order.

    Args:
        bundles: The compared bundles.
        swept: Axes varied on purpose (``charllm-kit run`` field names, as a sweep file's axes
            name them: ``micro_batch_size``, ``global_batch_size``, ``dtype``, ``engine``,
            ``platform``, ``workload``, ``tp``...): their differences are said as swept axes
            in one ``swept`` line instead of being flagged.
    """
    def config(key: str) -> Callable[[Bundle], Any]:
        return lambda b: b.manifest.config.get(key)

    def unless_swept(axis: str, checks: list[Check]) -> list[Check]:
        return [] if axis in swept else checks

    def platform(b: Bundle) -> str:
        p = b.manifest.platform
        dtype = b.manifest.config["dtype"]
        peak = p["peak_tflops"].get(dtype)
        return f"{p['name']} ({p.get('device_name')}, " + (
            f"peak {peak} TFLOP/s {dtype})" if peak else f"no {dtype} peak)")

    trained = [b for b in bundles if run_kind(b.manifest.config).trains]  # fabric: no engine
    return [
        *_projected_checks(bundles),
        *_unverified_checks(bundles),
        *unless_swept("workload", _workload_checks(trained)),
        *_scaled_checks(trained),
        *unless_swept("platform", _differs(
            "platform", "platforms, MFU is against each one's own peak", bundles, platform)),
        *[c for name, same in _by_value(bundles, lambda b: b.manifest.platform["name"]).items()
          for c in _differs("platform", f"devices under platform {name}", same, _devices)],
        *unless_swept("engine", _differs("engine", "engines", trained,
                                         lambda b: b.manifest.config.get("engine", "megatron"))),
        *_software_checks(bundles),
        *unless_swept("dtype", _differs("precision", "precision", bundles, config("dtype"))),
        *unless_swept("global_batch_size", _differs("batch", "global batch", trained,
                                                    config("global_batch_size"))),
        *unless_swept("micro_batch_size", _differs("batch", "micro-batch", trained,
                                                   config("micro_batch_size"))),
        *unless_swept("workload", _differs("sequence", "sequence length", bundles,
                                           lambda b: b.manifest.workload.get("seq_length"))),
        *unless_swept("eager", _differs(
            "execution", "execution modes (graphed steps leave the host less to do)", trained,
            recorded_mode)),
        *_swept_check(trained, swept),
        *_differs("telemetry", "energy sources", bundles, energy_source),
        *_differs("telemetry", "power sources", bundles, power_source),
        *_differs("schema", "bundle schema versions", bundles,
                  lambda b: b.manifest.schema_version),
        *_status_checks(bundles),
        *_image_checks(bundles),
    ]
