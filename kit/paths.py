"""Where the kit finds its shipped workload and platform YAML files.

In a source checkout (and in the container images, which install the checkout in editable
mode) they live beside the package at the repository root. ``CHARLLM_KIT_HOME`` overrides that.
"""

import os
from pathlib import Path


def kit_home() -> Path:
    """Return the directory that holds ``workloads/`` and ``platforms/``."""
    env = os.environ.get("CHARLLM_KIT_HOME")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent


def workloads_dir() -> Path:
    """Return the directory of shipped workload specs."""
    return kit_home() / "workloads"


def platforms_dir() -> Path:
    """Return the directory of shipped platform profiles."""
    return kit_home() / "platforms"
