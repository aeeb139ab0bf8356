"""The validation points of issues 29 and 37, and one name per layout for predicted and measured.

gpt3-1.3b, micro-batch 2, global batch 16 (issue 24's small shape) on 2 and 4 GPUs of one
host: DP2, DP4, TP2+SP, TP4+SP, PP2, PP4 and TP2 x PP2 + SP; and one study shape at full width
cut in depth: gpt3-175b-4l TP2+SP x DP2 with the distributed optimizer, micro-batch 1, global
batch 8 (its source: one GPU running the same architecture with one layer, :data:`SOURCES`).
:data:`ORDER` is the order a budget-limited call measures them in: the points the model missed
or never measured first.
"""

from typing import Any

WORKLOAD = "gpt3-1.3b"
MICRO_BATCH = 2
GLOBAL_BATCH = 16
STUDY_WORKLOAD = "gpt3-175b-4l"
STUDY_SOURCE = "gpt3-175b-1l"
"""gpt3-175b's architecture with one layer: what one GPU holds (written by validate_gpu.sh)."""
POINTS: dict[str, tuple[int, dict[str, Any]]] = {
    "dp2": (2, {"dp": 2}),
    "dp4": (4, {"dp": 4}),
    "tp2-sp": (2, {"tp": 2, "sp": True}),
    "tp4-sp": (4, {"tp": 4, "sp": True}),
    "pp2": (2, {"pp": 2}),
    "pp4": (4, {"pp": 4}),
    "tp2xpp2-sp": (4, {"tp": 2, "pp": 2, "sp": True}),
    "175b-4l-tp2xdp2-sp-distopt": (4, {"workload": STUDY_WORKLOAD, "tp": 2, "dp": 2, "sp": True,
                                       "dist_optimizer": True, "micro_batch_size": 1,
                                       "global_batch_size": 8}),
}
"""Name -> (GPUs, ProjectionTarget fields; workload and batch default to gpt3-1.3b's)."""
ORDER = ("tp4-sp", "tp2-sp", "dp4", "pp4", "tp2xpp2-sp", "175b-4l-tp2xdp2-sp-distopt", "dp2",
         "pp2")


def target_fields(name: str) -> dict[str, Any]:
    """A point's ProjectionTarget fields with the workload and batch filled in."""
    fields = dict(POINTS[name][1])
    fields.setdefault("micro_batch_size", MICRO_BATCH)
    fields.setdefault("global_batch_size", GLOBAL_BATCH)
    return fields


def point_name(config: dict[str, Any]) -> str:
    """A resolved config's layout as a point name: ``tp2xpp2-sp``, ``tp2xdp2-sp``, ``dp4``...

    Workload, micro and global batch are left out: :func:`point_key` carries them.
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
    """``charllm-kit run`` arguments for a point's fields: the workload first, then options."""
    fields = dict(fields)
    out: list[str] = [fields.pop("workload", WORKLOAD)]
    names = {"micro_batch_size": "micro-batch", "global_batch_size": "global-batch",
             "dist_optimizer": "dist-optimizer"}
    for key, value in fields.items():
        flag = "--" + names.get(key, key)
        if value is True:
            out.append(flag)
        else:
            out += [flag, str(value)]
    return out


if __name__ == "__main__":  # `python3 points.py NAME`: GPUs and run arguments, for the script
    import sys

    gpus, _ = POINTS[sys.argv[1]]
    print(gpus, " ".join(run_flags(target_fields(sys.argv[1]))))
