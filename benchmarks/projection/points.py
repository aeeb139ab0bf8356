"""The validation points of issue 29, and one name per layout for predicted and measured alike.

gpt3-1.3b, micro-batch 2, global batch 16 (issue 24's small shape) on 2 and 4 GPUs of one
host: DP2, DP4, TP2+SP, TP4+SP, PP2, PP4 and TP2 x PP2 + SP.
"""

from typing import Any

WORKLOAD = "gpt3-1.3b"
MICRO_BATCH = 2
GLOBAL_BATCH = 16
POINTS: dict[str, tuple[int, dict[str, Any]]] = {
    "dp2": (2, {"dp": 2}),
    "dp4": (4, {"dp": 4}),
    "tp2-sp": (2, {"tp": 2, "sp": True}),
    "tp4-sp": (4, {"tp": 4, "sp": True}),
    "pp2": (2, {"pp": 2}),
    "pp4": (4, {"pp": 4}),
    "tp2xpp2-sp": (4, {"tp": 2, "pp": 2, "sp": True}),
}
"""Name -> (GPUs, layout options as ProjectionTarget fields and `run` flags)."""


def point_name(config: dict[str, Any]) -> str:
    """A resolved config's layout as a point name: ``tp2xpp2-sp``, ``tp2xdp2-sp``, ``dp4``...

    Workload, micro and global batch are left out: a validation compares one workload's
    layouts; :func:`point_key` carries them.
    """
    p, o = config["parallel"], config.get("optim") or {}
    dims = [f"{k}{p[k]}" for k in ("tp", "pp", "cp", "ep") if p.get(k, 1) > 1]
    dims += [f"vpp{p['vpp']}"] if p.get("vpp") else []
    dims += [f"dp{p['dp']}"] if p["dp"] > 1 or not dims else []
    name = "x".join(dims)
    flags = (["sp"] if p.get("sp") else []) + [
        flag for key, flag in (("dist_optimizer", "distopt"), ("overlap", "overlap"),
                               ("fsdp", "fsdp")) if o.get(key)]
    if o.get("recompute", "none") != "none":
        flags.append(f"recompute-{o['recompute']}")
    return "-".join([name, *flags])


def point_key(config: dict[str, Any]) -> tuple[Any, ...]:
    """What makes a prediction and a measurement the same point."""
    p = config["parallel"]
    return (config["workload"]["name"], point_name(config), p["dp"],
            config["micro_batch_size"], config["global_batch_size"])


def run_flags(fields: dict[str, Any]) -> list[str]:
    """``charllm-kit run`` options for a point's layout fields."""
    out: list[str] = []
    for key, value in fields.items():
        if value is True:
            out.append(f"--{key}")
        else:
            out += [f"--{key}", str(value)]
    return out
