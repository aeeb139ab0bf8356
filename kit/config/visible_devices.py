"""Which of a node's accelerators this process may use: the vendors' visible-device variables.

A batch system (Slurm's GPU binding), a container runtime or a user sets
``CUDA_VISIBLE_DEVICES`` (NVIDIA) or ``ROCR_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` (AMD;
HIP also honours ``CUDA_VISIBLE_DEVICES``) to give a process part of a host. The runtime then
numbers the visible devices 0..n-1, so a rank's local index keeps meaning "its device"; the
driver libraries the telemetry reads (NVML, AMD SMI) do not, and index every device of the
node. This module maps one onto the other so the kit counts, samples and records only the
devices its ranks run on.

Indices are taken in the drivers' order (PCI bus order: nvidia-smi's, amd-smi's). CUDA's own
default order is fastest-first, the same order on a node of identical GPUs; set
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` on a mixed node.
"""

import os
from collections.abc import Sequence

from kit.errors import KitInputError

VISIBLE_VARIABLES: dict[str, tuple[str, ...]] = {
    "nvidia": ("CUDA_VISIBLE_DEVICES",),
    "amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
}
"""Per vendor, the variables that hide devices, in the order the runtime applies them."""


def _parse(variable: str, value: str, count: int) -> list[int]:
    """The driver indices a variable's value names, checked against ``count`` devices."""
    tokens = [t.strip() for t in value.split(",") if t.strip()]
    indices: list[int] = []
    for token in tokens:
        if not token.isdigit():
            raise KitInputError(
                f"{variable}={value}: the kit maps devices by index; name them as indices "
                f"0..{count - 1} (nvidia-smi -L lists them), not '{token}'")
        index = int(token)
        if index >= count:
            raise KitInputError(
                f"{variable}={value}: device {index} is not on this node ({count} device(s))")
        if index in indices:
            raise KitInputError(f"{variable}={value}: device {index} is named twice")
        indices.append(index)
    return indices


def visible_indices(vendor: str, count: int, env: dict[str, str] | None = None) -> list[int]:
    """Driver indices of the ``count`` devices of a node that the environment leaves visible.

    Each variable of :data:`VISIBLE_VARIABLES` that is set narrows the list further: its
    indices count among the devices the previous ones left, as the runtimes do (e.g.
    ``ROCR_VISIBLE_DEVICES=2,3`` with ``HIP_VISIBLE_DEVICES=1`` leaves device 3). An empty
    value hides every device.

    Raises:
        KitInputError: A value that names a device by something other than its index, a
            device the node lacks, or one device twice.
    """
    env = dict(os.environ) if env is None else env
    indices = list(range(count))
    for variable in VISIBLE_VARIABLES.get(vendor, ()):
        value = env.get(variable)
        if value is None:
            continue
        indices = [indices[i] for i in _parse(variable, value, len(indices))]
    return indices


def visible_description(vendor: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The visible-device variables that are set, for the node inventory."""
    env = dict(os.environ) if env is None else env
    return {v: env[v] for v in VISIBLE_VARIABLES.get(vendor, ()) if v in env}


def select(names: Sequence[str], vendor: str, env: dict[str, str] | None = None
           ) -> tuple[str, ...]:
    """The visible ones of a node's device ``names`` (listed in driver order)."""
    return tuple(names[i] for i in visible_indices(vendor, len(names), env))
