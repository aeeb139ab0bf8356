"""Recognize the container a process runs in and the image it came from.

No runtime tells a process everything: podman sets ``container=podman`` but shows its image
only to privileged containers, docker leaves an empty ``/.dockerenv``, Apptainer names its image
file, enroot shows nothing of its own. So the kit's launcher (:mod:`kit.container.command`)
passes what it knows in ``CHARLLM_CONTAINER_*`` variables, and the image built by
docker/Dockerfile carries its flavour, version and revision in ``CHARLLM_IMAGE_*`` variables
that mirror its OCI labels. Each field takes the first source that has it.
"""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the bundle schema pulls in pyarrow: not at the CLI's import
    from kit.bundle.schema import ContainerRecord

RUNTIME_VAR = "CHARLLM_CONTAINER_RUNTIME"
"""Set by the kit's launcher: the runtime that started the container."""
IMAGE_VAR = "CHARLLM_CONTAINER_IMAGE"
"""Set by the kit's launcher: the image reference it gave the runtime."""
DIGEST_VAR = "CHARLLM_CONTAINER_DIGEST"
"""Set by the kit's launcher when the runtime could tell it: the image ID, sha256:<hex>."""
FLAVOUR_VAR = "CHARLLM_IMAGE_FLAVOUR"
"""Set by the image (docker/Dockerfile): cpu, cuda or rocm."""
VERSION_VAR = "CHARLLM_IMAGE_VERSION"
"""Set by the image: the kit version it was built from."""
REVISION_VAR = "CHARLLM_IMAGE_REVISION"
"""Set by the image: the source commit it was built from."""

SHM_MIN_BYTES = 1 << 30
"""Smallest /dev/shm the kit accepts without a warning. docker and podman give 64 MiB by
default; PyTorch's multiprocessing and NCCL's shared-memory transport between the GPUs of a node
need more, and NVIDIA's and PyTorch's container guides ask for --ipc=host or --shm-size >= 1g."""


def _runtime(env: Mapping[str, str]) -> str | None:
    """The runtime, most specific source first; None outside a container."""
    if env.get(RUNTIME_VAR):
        return env[RUNTIME_VAR]
    if env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER"):
        return "apptainer"
    if env.get("container"):  # podman, systemd-nspawn and LXC set it (the systemd convention)
        return env["container"]
    if Path("/.dockerenv").exists():
        return "docker"
    if env.get(FLAVOUR_VAR):  # the image's own variables, under a runtime that says nothing
        return "unknown"
    return None


def _shm_bytes() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def container_record() -> "ContainerRecord | None":
    """The container this process runs in, or None on a bare host."""
    from kit.bundle.schema import ContainerRecord

    env = os.environ
    runtime = _runtime(env)
    if runtime is None:
        return None
    digest = env.get(DIGEST_VAR) or None
    if digest and not digest.startswith("sha256:"):
        digest = f"sha256:{digest}"  # podman prints image IDs without the algorithm
    return ContainerRecord(
        runtime=runtime,
        image=env.get(IMAGE_VAR) or env.get("APPTAINER_CONTAINER")
        or env.get("SINGULARITY_CONTAINER") or None,
        digest=digest,
        flavour=env.get(FLAVOUR_VAR) or None,
        version=env.get(VERSION_VAR) or None,
        revision=env.get(REVISION_VAR) or None,
        shm_bytes=_shm_bytes(),
    )


def shm_hint(record: "ContainerRecord | None") -> str | None:
    """One line saying how to fix a /dev/shm too small for training, or None if it is fine."""
    if record is None or record.shm_bytes is None or record.shm_bytes >= SHM_MIN_BYTES:
        return None
    return (f"/dev/shm is {record.shm_bytes / 2**20:.0f} MiB in this container, less than the "
            f"{SHM_MIN_BYTES / 2**30:.0f} GiB PyTorch and NCCL need: start it with --ipc=host "
            "(or --shm-size=8g)")
