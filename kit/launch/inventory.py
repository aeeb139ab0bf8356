"""Describe the node a run ran on, for the manifest."""

import platform as pyplatform
import socket
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import psutil

from kit.bundle.schema import NodeInventory
from kit.spec.detect import local_accelerator_names

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


def node_inventory(device_facts: list[dict[str, Any]] | None = None) -> NodeInventory:
    """Hardware and software of this node.

    Args:
        device_facts: What a telemetry backend read of each device (name, uuid, power limit,
            max SM clock, memory); without it, devices as their drivers name them.
    """
    import torch

    gpus = device_facts or [
        {"device": i, "name": n} for i, n in enumerate(local_accelerator_names())
    ]
    return NodeInventory(
        host=socket.gethostname(),
        cpu=_cpu_model(),
        cpu_count=psutil.cpu_count() or 1,
        memory_bytes=psutil.virtual_memory().total,
        gpus=gpus,
        driver=_nvidia_driver() if gpus else None,
        cuda=torch.version.cuda,
        rocm=getattr(torch.version, "hip", None),
        python=pyplatform.python_version(),
        torch=torch.__version__,
        engine_versions=_installed(ENGINE_PACKAGES),
    )
