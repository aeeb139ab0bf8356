"""Containers: what the image a run is in says about itself, and how to start one.

``detect`` reads the container a process runs in (for the manifest and the /dev/shm check);
``command`` writes the command that runs the kit in a platform's image under one of
:data:`RUNTIMES`. This module only names them, so the CLI can offer them without importing more.
"""

from typing import Literal, get_args

Runtime = Literal["docker", "podman", "apptainer", "pyxis"]
RUNTIMES: tuple[str, ...] = get_args(Runtime)
"""Container runtimes the kit writes commands for; pyxis is Slurm's plugin over enroot."""
