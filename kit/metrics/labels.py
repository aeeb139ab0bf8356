"""Names for configurations and devices, as tables and figures show them.

A configuration is named by its parts in a fixed order: workload, platform and world size,
dtype, engine, parallel layout, optimizations and batch (:func:`configuration_parts`). When
several configurations are shown together, the parts they all share are said once
(:func:`split_shared`) and each keeps only what tells it apart, so eleven layouts of one model
on one machine read ``megatron tp2 pp2 dp1`` rather than ``gpt3-1.3b h200 x4 bf16 megatron tp2
pp2 dp1 mb1 gb128`` eleven times.

A device is named by where it sits and what it ran (:func:`device_roles`): node, chassis slot
(``platform.chassis``), and the rank that ran on it (:func:`rank_device`: a node's local ranks
take the GPUs its inventory lists, in order), with that rank's pipeline stage and
its tensor-, context- and expert-parallel ranks where those degrees exceed one.
"""

from dataclasses import dataclass
from typing import Any

from kit.bundle.schema import Manifest
from kit.config.run_kind import run_kind


def layout_parts(config: dict[str, Any]) -> list[str]:
    """Engine, parallel layout, optimizations and batch of a resolved config, as tokens
    (``collectives`` for a fabric benchmark, which trains nothing).

    Megatron names TP and PP always (the study's axes); DeepSpeed, which has no tensor
    parallelism, names its ZeRO stage first and PP only when pipelined; FSDP2 (data parallel
    only) names neither. Other degrees appear when they are not 1.
    """
    if not run_kind(config).trains:  # a collective benchmark: no engine, no batch
        return ["collectives"]
    p, optim = config["parallel"], config.get("optim") or {}
    engine = config.get("engine", "megatron")
    parts = [engine]
    if engine == "deepspeed":
        parts += [f"zero{optim.get('zero', 0)}"] + (["offload"] if optim.get("offload") else [])
        parts += [f"pp{p['pp']}"] if p["pp"] != 1 else []
        parts += [f"tp{p['tp']}"] if p["tp"] != 1 else []
    elif engine != "fsdp2":  # FSDP2 is data parallel only
        parts += [f"tp{p['tp']}", f"pp{p['pp']}"]
    parts += [f"dp{p['dp']}"]
    parts += [f"{k}{p[k]}" for k in ("cp", "ep") if p.get(k, 1) != 1]
    parts += [f"vpp{p['vpp']}"] if p.get("vpp") else []
    parts += ["sp"] if p.get("sp") else []
    parts += ([f"recompute={optim['recompute']}"]
              if optim.get("recompute", "none") != "none" else [])
    parts += [k for k in ("overlap", "dist_optimizer", "fsdp") if optim.get(k)]
    if engine != "deepspeed" and optim.get("zero"):
        parts += [f"zero{optim['zero']}"]
    parts += [f"mb{config['micro_batch_size']}", f"gb{config['global_batch_size']}"]
    return parts


def layout_label(config: dict[str, Any]) -> str:
    """The engine, layout and batch of a resolved config, e.g. ``megatron tp2 pp1 dp4 mb1 gb128``
    or ``deepspeed zero1 dp4 mb1 gb128``.
    """
    return " ".join(layout_parts(config))


def configuration_parts(manifest: Manifest) -> list[list[str]]:
    """A run's configuration as lines of tokens: workload; platform, world size and dtype;
    engine, layout, optimizations and batch.
    """
    return [[manifest.workload["name"]],
            [f"{manifest.platform['name']} x{len(manifest.ranks)}", manifest.config["dtype"]],
            layout_parts(manifest.config)]


@dataclass(frozen=True)
class SharedSplit:
    """Configurations with the parts they all share taken out."""

    shared: list[str]
    """Tokens every configuration has, in the first one's order."""
    own: list[list[list[str]]]
    """Per configuration, its lines of the tokens left (a line may be empty)."""


def split_shared(configurations: list[list[list[str]]]) -> SharedSplit:
    """Take the tokens every configuration has out of each (only with two or more)."""
    if len(configurations) < 2:
        return SharedSplit([], configurations)
    common = set.intersection(*({t for line in c for t in line} for c in configurations))
    shared = [t for line in configurations[0] for t in line if t in common]
    own = [[[t for t in line if t not in common] for line in c] for c in configurations]
    return SharedSplit(shared, own)


def shared_phrase(tokens: list[str]) -> str:
    """Shared tokens as a phrase: ``gpt3-1.3b h200 x4 bf16 megatron mb1 gb128``."""
    return " ".join(tokens)


@dataclass(frozen=True)
class DeviceRole:
    """One device of a run: where it sits and which rank (if any) it ran."""

    node: int
    device: int
    slot: str | None
    rank: int | None
    role: str
    """The rank's place in the layout, e.g. ``r5 pp1 tp1``; ``no rank`` for an idle device."""

    @property
    def place(self) -> str:
        """Node and slot (or device index), e.g. ``n0 SXM3``."""
        return f"n{self.node} {self.slot or f'dev{self.device}'}"

    @property
    def label(self) -> str:
        """Place and role on two lines."""
        return f"{self.place}\n{self.role}"


def _role(rank: Any, parallel: dict[str, Any]) -> str:
    parts = [f"r{rank.rank}"]
    parts += [f"pp{rank.stage}"] if parallel.get("pp", 1) > 1 else []
    parts += [f"tp{rank.tp_rank}"] if parallel.get("tp", 1) > 1 else []
    parts += [f"cp{rank.cp_rank}"] if parallel.get("cp", 1) > 1 else []
    parts += [f"ep{rank.ep_rank}"] if parallel.get("ep", 1) > 1 else []
    if len(parts) == 1 and parallel.get("dp", 1) > 1:
        parts.append(f"dp{rank.dp_rank}")
    return " ".join(parts)


def rank_device(manifest: Manifest, node: int, local_rank: int) -> int:
    """The driver index of the device local rank ``local_rank`` of ``node`` ran on.

    A node's ranks run on the GPUs its inventory lists, in that order: under
    ``CUDA_VISIBLE_DEVICES=2,3`` local rank 0 is device 2. Without a listed GPU (CPU runs, a
    replayed trace) the local rank is the device index.
    """
    return device_index(manifest.inventory[node].gpus if node < len(manifest.inventory) else [],
                        local_rank)


def device_index(gpus: list[dict[str, Any]], local_rank: int) -> int:
    """The driver index of the ``local_rank``-th of a node's inventory ``gpus``.

    The local rank itself where none is listed.
    """
    if local_rank < len(gpus) and "device" in gpus[local_rank]:
        return int(gpus[local_rank]["device"])
    return local_rank


def device_roles(manifest: Manifest, devices: list[tuple[int, int]]) -> list[DeviceRole]:
    """Roles of ``devices`` (``(node, device)`` pairs, by driver index), sorted."""
    slots = {p["device"]: p.get("slot") for p in manifest.platform.get("chassis") or []}
    ranks = {(r.node, rank_device(manifest, r.node, r.local_rank)): r for r in manifest.ranks}
    parallel = manifest.config.get("parallel") or {}
    out = []
    for node, device in sorted(set(devices)):
        rank = ranks.get((node, device))
        out.append(DeviceRole(node, device, slots.get(device),
                              rank.rank if rank else None,
                              _role(rank, parallel) if rank else "no rank"))
    return out


def chassis_assumed(platform: dict[str, Any]) -> bool:
    """Whether a platform profile's chassis layout is an assumption (``chassis_assumed``; a
    profile recorded before the field existed had only assumed layouts)."""
    return bool(platform.get("chassis")) and platform.get("chassis_assumed", True) is not False
