"""Describe the node a run ran on, for the manifest."""

import importlib.util
import os
import platform as pyplatform
import runpy
import socket
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psutil

from kit.bundle.schema import NodeInventory
from kit.config import visible_devices
from kit.telemetry.devices import node_accelerators

ENGINE_PACKAGES = ("megatron-core", "deepspeed", "transformer-engine", "zeus")


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return pyplatform.processor() or pyplatform.machine()


def _installed(names: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            continue
    return out


def torch_versions() -> tuple[str, str | None, str | None]:
    """torch's version and the CUDA and ROCm versions it was built for.

    Read from ``torch/version.py`` (plain assignments the build writes) without importing
    torch, which costs the launcher 2-4 s of CPU beside the ranks it just started; from torch
    itself where this process has imported it already.

    Raises:
        ImportError: torch is not installed.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.__version__, torch.version.cuda, getattr(torch.version, "hip", None)
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise ImportError("torch is not installed")
    values = runpy.run_path(str(Path(spec.origin).parent / "version.py"))
    return values["__version__"], values.get("cuda"), values.get("hip")


def _nvidia_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return str(pynvml.nvmlSystemGetDriverVersion())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVIDIA driver on this host
        return None


IB_SYSFS = Path("/sys/class/infiniband")


def _sysfs(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _infiniband_ports() -> list[dict[str, Any]]:
    """Every port of every InfiniBand (or RoCE) device the kernel lists, with its state."""
    out = []
    for dev in sorted(IB_SYSFS.glob("*")) if IB_SYSFS.is_dir() else []:
        for port in sorted((dev / "ports").glob("*")):
            out.append({"kind": "infiniband", "name": dev.name, "port": int(port.name),
                        "state": _sysfs(port / "state"), "rate": _sysfs(port / "rate"),
                        "link_layer": _sysfs(port / "link_layer")})
    return out


def network_devices() -> list[dict[str, Any]]:
    """Network interfaces (but loopback) and InfiniBand ports of this node.

    Speed is what the driver reports, in Mb/s; null where it reports none (virtual links).
    """
    stats = psutil.net_if_stats()
    eth = [{"kind": "interface", "name": name, "speed_mbps": st.speed or None, "mtu": st.mtu,
            "up": st.isup}
           for name, st in sorted(stats.items()) if name != "lo"]
    return eth + _infiniband_ports()


def node_inventory(
    device_facts: list[dict[str, Any]] | None = None, used: int | None = None
) -> NodeInventory:
    """Hardware and software of this node.

    Args:
        device_facts: What a telemetry backend read of each device (name, uuid, power limit,
            max SM clock, memory); without it, devices as their drivers name them.
        used: How many devices the node's ranks run on (the first visible ones); default:
            every visible device.
    """
    torch_version, cuda, rocm = torch_versions()
    vendor, names = node_accelerators()
    indices = visible_devices.visible_indices(vendor, len(names))
    gpus = device_facts or [{"device": i, "name": names[i]} for i in indices[:used]]
    return NodeInventory(
        host=socket.gethostname(),
        cpu=_cpu_model(),
        cpu_count=psutil.cpu_count() or 1,
        memory_bytes=psutil.virtual_memory().total,
        gpus=gpus,
        driver=_nvidia_driver() if gpus else None,
        cuda=cuda,
        rocm=rocm,
        python=pyplatform.python_version(),
        torch=torch_version,
        engine_versions=_installed(ENGINE_PACKAGES),
        network=network_devices(),
        visible_devices=visible_devices.visible_description(vendor),
        slurm_node=os.environ.get("SLURMD_NODENAME"),
    )
