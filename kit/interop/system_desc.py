"""An MLPerf training system description derived from a bundle's manifest.

The keys are the ones mlperf_logging's ``system_desc_checker`` requires. Every value but
``other_software_stack`` is a string, counts included, as in MLPerf's published
``systems/*.json``: the checker joins some of them (``accelerators_per_node``, ...) into its
summary row as strings. What the manifest does not record (processor caches, storage, cooling,
operating system, ...) is the empty string, MLPerf's "not stated", never a guess. Node 0 is
described; when nodes differ, ``hw_notes`` says so. A bundle that failed verification and is
described only because of ``--allow-unverified`` says so, and what failed, in ``sw_notes``.
"""

from typing import Any

from kit.bundle.reader import Bundle
from kit.bundle.schema import Manifest, NodeInventory
from kit.engines import engine_packages
from kit.interop.mllog_constants import OPEN

SYSTEM_DESC_FIELDS: tuple[str, ...] = (
    "submitter", "division", "status", "system_name", "number_of_nodes",
    "host_processors_per_node", "host_processor_model_name", "host_processor_core_count",
    "host_processor_vcpu_count", "host_processor_frequency", "host_processor_caches",
    "host_processor_interconnect", "host_memory_capacity", "host_storage_type",
    "host_storage_capacity", "host_networking", "host_networking_topology",
    "host_memory_configuration", "accelerators_per_node", "accelerator_model_name",
    "accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
    "accelerator_memory_configuration", "accelerator_memory_capacity",
    "accelerator_interconnect", "accelerator_interconnect_topology", "cooling", "hw_notes",
    "framework", "other_software_stack", "operating_system", "sw_notes",
)
"""Every key of an MLPerf training system description, in the checker's order."""

DIVISION = OPEN
"""Kit runs train on synthetic tokens for a fixed step count: never a closed-division result."""

AVAILABILITY = "Research, Development, or Internal (RDI)"
"""MLPerf's availability status for a measurement that is not a submission."""


def system_name(manifest: Manifest) -> str:
    """Name the system as MLPerf does, platform and node count: e.g. ``h100_n4``."""
    return f"{manifest.platform['name']}_n{len(manifest.inventory)}"


def _interconnects(platform: dict[str, Any], scope: str) -> str:
    return ", ".join(i["name"] for i in platform.get("interconnects", []) if i["scope"] == scope)


def _gib(n_bytes: float | None) -> str:
    return f"{n_bytes / 2**30:.0f} GiB" if n_bytes else ""


def _framework(node: NodeInventory, engine: str) -> str:
    """The run's engine and torch versions, e.g. ``megatron-core 0.16.0, PyTorch 2.13.0 (CUDA
    13.0)``: the other engines installed beside it trained nothing."""
    used, _ = engine_packages(engine)
    engines = [f"{name} {v}" for name, v in sorted(node.engine_versions.items())
               if name in used or (not used and name != "zeus")]
    runtime = (f"CUDA {node.cuda}" if node.cuda
               else f"ROCm {node.rocm}" if node.rocm else "CPU")
    torch = [f"PyTorch {node.torch} ({runtime})"] if node.torch else []
    return ", ".join(engines + torch)


def system_description(bundle: Bundle, submitter: str) -> dict[str, Any]:
    """Describe the system a bundle ran on with MLPerf's system description keys.

    Args:
        bundle: A bundle from :func:`kit.bundle.verified.read_verified_bundle`.
        submitter: The organization named as submitter.

    Returns:
        One value per key of :data:`SYSTEM_DESC_FIELDS`, in that order.
    """
    manifest = bundle.manifest
    platform, nodes = manifest.platform, manifest.inventory
    node = nodes[0]
    gpus = node.gpus
    gpu = gpus[0] if gpus else {}
    kinds = {(n.cpu, tuple(g.get("name") for g in n.gpus)) for n in nodes}
    hw_notes = [platform.get("description") or "",
                f"interconnects as the {platform['name']} platform profile declares them"]
    if len(kinds) > 1:
        hw_notes.append(f"nodes differ ({len(kinds)} kinds); node 0 described")
    sm_clock = gpu.get("clock_sm_max_mhz")
    memory = gpu.get("memory_total_bytes") or (
        platform["memory_per_device_gib"] * 2**30 if gpus else None
    )
    engine = manifest.config.get("engine", "")
    _, unused = engine_packages(engine)
    software = {"python": node.python,
                **{k: v for k, v in node.engine_versions.items() if k not in unused}}
    software.update({k: v for k in ("driver", "cuda", "rocm") if (v := getattr(node, k))})
    sw_notes = [f"charllm-kit {manifest.kit_version}", "synthetic tokens",
                f"bundle schema v{manifest.schema_version}"]
    if bundle.verification_error is not None:
        sw_notes.append(f"UNVERIFIED bundle, described only because of --allow-unverified: "
                        f"{bundle.verification_error}")
    values: dict[str, Any] = {
        "submitter": submitter,
        "division": DIVISION,
        "status": AVAILABILITY,
        "system_name": system_name(manifest),
        "number_of_nodes": str(len(nodes)),
        "host_processor_model_name": node.cpu,
        "host_processor_vcpu_count": str(node.cpu_count),
        "host_memory_capacity": _gib(node.memory_bytes),
        "host_networking": _interconnects(platform, "inter_node"),
        "accelerators_per_node": str(len(gpus)),
        "accelerator_model_name": gpu.get("name") or (platform["device_name"] if gpus else ""),
        "accelerator_host_interconnect": _interconnects(platform, "host") if gpus else "",
        "accelerator_frequency": f"{sm_clock:g} MHz" if sm_clock else "",
        "accelerator_memory_capacity": _gib(memory),
        "accelerator_interconnect": _interconnects(platform, "intra_node") if gpus else "",
        "hw_notes": "; ".join(n for n in hw_notes if n),
        "framework": _framework(node, engine),
        "other_software_stack": software,
        "sw_notes": "; ".join(sw_notes),
    }
    return {key: values.get(key, "") for key in SYSTEM_DESC_FIELDS}
