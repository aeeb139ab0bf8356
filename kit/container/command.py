"""The command that runs the kit inside a platform's container image, for each runtime.

One function writes it for every runtime, for ``./run.sh --container`` (this node) and for the
multi-node Slurm launcher, which will run it on every node when multi-node launch lands. Devices:

    docker     --gpus all (NVIDIA Container Toolkit)
    podman     --device nvidia.com/gpu=all (CDI; podman 4.3, Debian 12's, has no --gpus)
    either     --device /dev/kfd --device /dev/dri --group-add video on AMD (ROCm's guide)
    apptainer  exec --nv | --rocm
    pyxis      srun --container-image: enroot's hooks bring the GPUs the site configured

docker and podman also get ``--network host`` (NCCL and the rendezvous see the node's own
interfaces), ``--ipc host`` (PyTorch and NCCL need more /dev/shm than the 64 MiB default) and,
on GPUs, ``--ulimit memlock=-1`` (NCCL pins memory for InfiniBand), as NVIDIA's and AMD's
container guides ask. Every runtime gets the ``CHARLLM_CONTAINER_*`` variables that
:mod:`kit.container.detect` records, and the folders the run reads or writes are bound at the
same path inside, so the bundle path the run prints is right on both sides.
"""

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from kit.config.platform import PlatformSpec
from kit.container import Runtime
from kit.container.detect import DIGEST_VAR, IMAGE_VAR, RUNTIME_VAR
from kit.errors import KitInputError
from kit.neutralize import control_problem

_BINARY = {"docker": "docker", "podman": "podman", "apptainer": "apptainer", "pyxis": "srun"}


def _devices(platform: PlatformSpec, runtime: Runtime) -> list[str]:
    """Flags that give the container the platform's accelerators."""
    if platform.vendor == "nvidia":
        return {"docker": ["--gpus", "all", "--ulimit", "memlock=-1"],
                "podman": ["--device", "nvidia.com/gpu=all", "--ulimit", "memlock=-1"],
                "apptainer": ["--nv"]}.get(runtime, [])
    if platform.vendor == "amd":
        amd = ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video",
               "--ulimit", "memlock=-1"]
        return {"docker": amd, "podman": amd, "apptainer": ["--rocm"]}.get(runtime, [])
    return []


def list_element(value: str, field: str, separators: str, argument: str) -> str:
    """``value`` unchanged when it is one element of the list ``argument`` splits.

    Slurm splits ``--export`` at commas, pyxis ``--container-mounts`` and Apptainer ``--bind``
    and ``--env`` at commas and a mount at colons: a value holding one would add elements of
    its own (``img,LD_PRELOAD=/x.so``, a path ``a,/:/host:rw``), so it is refused.

    Raises:
        KitInputError: ``value`` holds one of ``separators`` or a control character; the line
            names ``field``.
    """
    problem = control_problem(value, field)
    if problem:
        raise KitInputError(problem)
    found = next((c for c in value if c in separators), None)
    if found is not None:
        raise KitInputError(f"{field} {value!r} holds {found!r}, which separates the elements "
                            f"of {argument}: it would add elements of its own")
    return value


def _not_an_option(value: str, field: str) -> str:
    """``value`` unchanged unless the runtime would read it as an option (a leading ``-``)."""
    if value.startswith("-"):
        raise KitInputError(f"{field} {value!r} starts with '-': the container runtime would "
                            "take it for an option, not an image")
    return value


def _apptainer_image(image: str) -> str:
    """A .sif file or a URI as given; a name is pulled from its registry (docker://)."""
    if "://" in image or image.endswith(".sif") or image.startswith(("/", ".")):
        return image
    return f"docker://{image}"


def container_command(
    platform: PlatformSpec,
    runtime: Runtime,
    image: str,
    kit_args: Sequence[str],
    binds: Mapping[str, Path],
    digest: str | None = None,
    image_field: str = "--image",
) -> list[str]:
    """The argv that runs ``charllm-kit KIT_ARGS`` in ``image`` on this node.

    Args:
        platform: The platform whose devices the container gets.
        runtime: The container runtime.
        image: The image as the runtime takes it (name:tag; a .sif or .sqsh path).
        kit_args: The kit's arguments, e.g. ``["run", "gpt3-small", "--out", "/abs/results"]``.
        binds: Absolute host paths bound at the same path inside (results, YAML files), by the
            option or field that named each (``--out``, ``workload``, ``platform``).
        digest: The image ID, when the runtime told it (:func:`image_digest`).
        image_field: Where ``image`` came from, for a refusal (``--image``, a platform's
            ``container_image``).

    Raises:
        KitInputError: An image or a path that would split the runtime's lists (a mount at
            ``:`` or ``,``; Slurm's ``--export`` and Apptainer's ``--env`` at ``,``), or an
            image starting with ``-``.
    """
    _not_an_option(image, image_field)
    for field, path in binds.items():  # every runtime's mount is SRC:DST; pyxis, apptainer: ,
        list_element(str(path), field, ":," if runtime in ("pyxis", "apptainer") else ":",
                     "a container mount (SRC:DST, listed with commas)")
    if runtime in ("pyxis", "apptainer"):  # the image is also an element of the env list
        list_element(image, image_field, ",", "srun --export" if runtime == "pyxis"
                     else "apptainer --env")
    env = {RUNTIME_VAR: runtime, IMAGE_VAR: image, **({DIGEST_VAR: digest} if digest else {})}
    devices = _devices(platform, runtime)
    if runtime in ("docker", "podman"):
        argv = [runtime, "run", "--rm", "--network", "host", "--ipc", "host", *devices]
        for path in binds.values():
            argv += ["-v", f"{path}:{path}"]
        for key, value in env.items():
            argv += ["-e", f"{key}={value}"]
        return [*argv, image, *kit_args]  # the image's entrypoint is charllm-kit
    if runtime == "apptainer":
        argv = ["apptainer", "exec", *devices]
        for path in binds.values():
            argv += ["--bind", f"{path}:{path}"]
        for key, value in env.items():
            argv += ["--env", f"{key}={value}"]
        return [*argv, _apptainer_image(image), "charllm-kit", *kit_args]
    argv = ["srun", f"--container-image={image}"]
    if binds:
        argv.append("--container-mounts=" + ",".join(f"{p}:{p}" for p in binds.values()))
    argv.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in env.items()))
    return [*argv, "charllm-kit", *kit_args]  # pyxis does not run the image's entrypoint


def default_runtime() -> Runtime:
    """The runtime to use: docker where its daemon listens, else podman, else apptainer.

    With none installed, docker: what ``--dry-run`` then prints for the most common engine.
    """
    if shutil.which("docker") and Path("/var/run/docker.sock").exists():
        return "docker"
    if shutil.which("podman"):
        return "podman"
    if shutil.which("apptainer"):
        return "apptainer"
    return "docker"


def image_digest(runtime: Runtime, image: str) -> str | None:
    """The image ID docker or podman has for a local ``image``, ``sha256:<hex>``; else None."""
    if runtime not in ("docker", "podman") or shutil.which(runtime) is None:
        return None
    try:
        out = subprocess.run([runtime, "image", "inspect", "--format", "{{.Id}}", image],
                             capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None  # not built or pulled here: the runtime pulls it and nobody knows its ID
    image_id = out.stdout.strip()
    return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"


def _is_yaml(name: str) -> bool:
    return Path(name).suffix in (".yaml", ".yml")


def run_in_container(
    workload: str,
    run_args: Sequence[str],
    platform: str | None,
    runtime: Runtime | None,
    image: str | None,
    out: Path,
    dry_run: bool,
) -> list[str]:
    """The command for ``./run.sh --container``: ``charllm-kit run`` in the platform's image.

    Args:
        workload: Workload name or YAML path.
        run_args: Further ``charllm-kit run`` options, passed on as they are.
        platform: Platform name or YAML path; None detects this host's.
        runtime: The container runtime; None picks :func:`default_runtime`.
        image: The image; None takes the platform's ``container_image``.
        out: Host folder for the bundle.
        dry_run: Only print the command: the platform need not be on this host, nor the runtime.

    Raises:
        KitInputError: The platform is not on this host (unless ``dry_run``), names no image,
            or the runtime is not installed.
    """
    from kit.config.loader import load_platform
    from kit.plan.detect import detect_platform, platform_present

    spec = load_platform(platform) if platform else detect_platform()
    if not dry_run and not platform_present(spec):
        raise KitInputError(
            f"platform {spec.name} ({spec.device_name}) is not present on this host; use "
            "--dry-run to print its container command here, or --platform cpu"
        )
    image_field = "--image" if image else f"platform {spec.name}'s container_image"
    image = image or spec.container_image
    if image is None:
        raise KitInputError(f"platform {spec.name} names no container_image; pass --image")
    runtime = runtime or default_runtime()
    if not dry_run and shutil.which(_BINARY[runtime]) is None:
        raise KitInputError(f"{_BINARY[runtime]} is not installed here; pick another "
                            "--container-runtime (docker, podman, apptainer, pyxis)")
    out = out.absolute()
    binds = {"--out": out}
    if _is_yaml(workload):
        workload = str(Path(workload).absolute())
        binds["workload"] = Path(workload)
    platform_arg = spec.name
    if platform and _is_yaml(platform):
        platform_arg = str(Path(platform).absolute())
        binds["--platform"] = Path(platform_arg)
    kit_args = ["run", workload, *run_args, "--platform", platform_arg, "--out", str(out)]
    _not_an_option(image, image_field)  # before the runtime is asked about it
    return container_command(spec, runtime, image, kit_args, binds,
                             image_digest(runtime, image), image_field)
