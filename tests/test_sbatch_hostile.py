"""Batch scripts built from hostile names, keys and options: nothing in them runs.

A workload, platform or option from another site ends up in the script ``submit`` writes; each
value is either quoted so that the shell and sbatch read it as data, or refused in one line.
The scripts are checked with ``bash -n`` and then run with stub ``srun``/``scontrol`` on PATH:
no marker file may appear, and srun must receive the hostile values intact.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

HOSTILE = "x $(touch {m}) `touch {m}` \"; touch {m}; '\\ #"
"""A value that runs ``touch MARKER`` if any shell or sbatch line takes it unquoted."""


def _kit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)


def _specs(folder: Path, marker: Path, workload_name: str, platform_name: str,
           env: dict[str, str]) -> tuple[Path, Path]:
    workload = yaml.safe_load((REPO / "workloads/gpt3-tiny.yaml").read_text())
    platform = yaml.safe_load((REPO / "platforms/cpu.yaml").read_text())
    workload["name"] = workload_name.format(m=marker)
    platform.update(name=platform_name.format(m=marker), env=env)
    w, p = folder / "w.yaml", folder / "p.yaml"
    w.write_text(yaml.safe_dump(workload))
    p.write_text(yaml.safe_dump(platform))
    return w, p


def _stubs(folder: Path) -> Path:
    """``srun`` that records its arguments one per line, ``scontrol`` that names one node."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done '
                                  f'> {folder}/srun.args\n')
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    for stub in ("srun", "scontrol"):
        (bin_dir / stub).chmod(0o755)
    return bin_dir


@pytest.mark.timeout(180)
def test_hostile_names_values_and_paths_are_quoted_and_nothing_runs(tmp_path):
    marker = tmp_path / "PWNED"
    specs = tmp_path / "specs"
    specs.mkdir()
    w, p = _specs(specs, marker, HOSTILE, HOSTILE, {"NCCL_X": HOSTILE.format(m=marker)})
    cwd = tmp_path / HOSTILE.format(m="m").replace("/", "_")
    cwd.mkdir()
    # no backslash: Slurm drops those from --output and stops expanding it (refused, below)
    out = tmp_path / ("out %u " + HOSTILE.format(m=marker).replace("/", "_").replace("\\", ""))
    r = _kit("submit", str(w), "--platform", str(p), "--container-runtime", "none",
             "--partition", "gpu,debug", "--account", "proj-1", "--time", "1-02:00",
             "--out", str(out), "--dry-run", cwd=cwd)
    assert r.returncode == 0, r.stderr
    output = next(line for line in r.stdout.splitlines() if line.startswith("#SBATCH --output"))
    assert "/out %%u " in output and output.endswith('/slurm-%j.out"')  # Slurm writes out %u/
    script = tmp_path / "job.sh"
    script.write_text(r.stdout)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    sbatch = [line for line in r.stdout.splitlines() if line.startswith("#SBATCH")]
    assert all("\n" not in line for line in sbatch)
    bin_dir = _stubs(tmp_path)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_NODELIST="node1",
               SLURM_JOB_ID="7")
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=60)
    assert run.returncode == 0, run.stderr
    assert not marker.exists(), r.stdout
    argv = (tmp_path / "srun.args").read_text().splitlines()
    assert str(out) in argv and str(w) in argv  # the values arrive whole, as data


@pytest.mark.parametrize(("workload_name", "platform_name", "env", "options", "refusal"), [
    ("a\ntouch {m}", "cpu", {}, [], "name: Value error, the value holds the control "
                                    "character \\x0a"),
    ("w", "p\r\x1b[2Kok", {}, [], "name: Value error, the value holds the control character"),
    ("w", "p", {"X=1; touch {m}; Y": "v"}, [], "String should match pattern"),
    ("w", "p", {"X": "v\n touch {m}"}, [], "the control character \\x0a"),
    ("w", "p", {}, ["--partition", "gpu\ntouch {m}"], "--partition 'gpu\\ntouch"),
    ("w", "p", {}, ["--account", "a b"], "is not a Slurm account name"),
    ("w", "p", {}, ["--time", "abc"], "--time 'abc' is not a Slurm time limit"),
    ("w", "p", {}, ["--time", "1:00\ntouch {m}"], "is not a Slurm time limit"),
    ("w", "p", {}, ["--out", "o\ntouch {m}"], "#SBATCH value"),
    ("w", "p", {}, ["--out", "o\\%j"], "holds a backslash, which stops Slurm"),
])
@pytest.mark.timeout(120)
def test_hostile_values_that_cannot_be_quoted_are_refused_in_one_line(
        tmp_path, workload_name, platform_name, env, options, refusal):
    marker = tmp_path / "PWNED"
    w, p = _specs(tmp_path, marker, workload_name, platform_name,
                  {k.format(m=marker): v.format(m=marker) for k, v in env.items()})
    options = [o.format(m=marker) for o in options]
    r = _kit("submit", str(w), "--platform", str(p), "--container-runtime", "none",
             *(["--out", str(tmp_path / "out")] if "--out" not in options else []),
             *options, "--dry-run", cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and refusal in lines[0], r.stderr
    assert "\x1b" not in r.stderr and "\r" not in r.stderr
    assert not marker.exists()


@pytest.mark.timeout(120)
def test_a_working_directory_with_a_newline_is_refused(tmp_path):
    cwd = tmp_path / "a\ntouch x"
    cwd.mkdir()
    r = _kit("submit", "gpt3-tiny", "--container-runtime", "none", "--out",
             str(tmp_path / "out"), "--dry-run", cwd=cwd)
    assert r.returncode == 2 and r.stderr.startswith("error: #SBATCH value"), r.stderr
    assert len(r.stderr.splitlines()) == 1
    shutil.rmtree(cwd)


def _platform(folder: Path, name: str, image: str) -> Path:
    platform = yaml.safe_load((REPO / "platforms/h100.yaml").read_text())
    platform.update(name="site", container_image=image)
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(platform))
    return path


@pytest.mark.parametrize(("platform", "image", "options", "refusal"), [
    ("site.yaml", "img:1,LD_PRELOAD=/x.so,INJ=1", ["--container-runtime", "pyxis"],
     "platform site's container_image 'img:1,LD_PRELOAD=/x.so,INJ=1' holds ',', which "
     "separates the elements of srun --export"),
    ("site.yaml", "img:1,LD_PRELOAD=/x.so", ["--container-runtime", "apptainer"],
     "holds ',', which separates the elements of apptainer --env"),
    ("site.yaml", "img", ["--container-runtime", "apptainer", "--image", "--bind=/:/host"],
     "--image '--bind=/:/host' starts with '-': the container runtime would take it for an "
     "option"),
    ("a,/:/host:rw,/site.yaml", "img", ["--container-runtime", "pyxis"],
     "holds ',', which separates the elements of a container mount"),
    ("a:b/site.yaml", "img", ["--container-runtime", "apptainer"],
     "holds ':', which separates the elements of a container mount"),
    ("site.yaml", "img", ["--container-runtime", "pyxis", "--out", "o,/:/host:rw"],
     "--out '{tmp}/o,/:/host:rw' holds ','"),
])
@pytest.mark.timeout(120)
def test_values_that_would_split_a_list_argument_are_refused_naming_the_field(
        tmp_path, platform, image, options, refusal):
    """Slurm splits --export, pyxis --container-mounts and apptainer --bind/--env at commas
    (mounts at colons too): a value holding one would add a variable or a mount of its own."""
    path = _platform(tmp_path, platform, image)
    r = _kit("submit", "gpt3-tiny", "--global-batch", "16", "--platform", str(path), *options,
             *(["--out", "out"] if "--out" not in options else []), "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and refusal.format(tmp=tmp_path) in lines[0], r.stderr


@pytest.mark.timeout(120)
def test_a_sweeps_yaml_paths_reach_the_job_absolute_and_are_checked(tmp_path):
    """A sweep point's platform path is relative to where the sweep runs: the job gets it (and
    its mount) absolute; a path holding ',/:/host:rw,' is refused, not mounted."""
    good = _platform(tmp_path, "specs/site.yaml", "img")
    bad = _platform(tmp_path, "a,/:/host:rw,/site.yaml", "img")
    for platform, ok in (("specs/site.yaml", True), ("a,/:/host:rw,/site.yaml", False)):
        sweep = tmp_path / "s.yaml"
        sweep.write_text(yaml.safe_dump({
            "name": "s", "base": {"workload": "gpt3-tiny", "global_batch_size": 16},
            "axes": [{"points": [{"platform": platform}]}]}))
        r = _kit("sweep", str(sweep), "--launcher", "slurm", "--container-runtime", "pyxis",
                 "--dry-run", "--json", "--out", "out", cwd=tmp_path)
        if ok:
            assert r.returncode == 0, r.stderr
            script = json.loads(r.stdout)["points"][0]["submit"]["script"]
            assert f"--container-mounts={tmp_path}/out/s/001-platform-specs-site.yaml:" in script
            assert f",{good}:{good}" in script and f" --platform {good} " in script
        else:
            assert r.returncode == 2, r.stderr
            assert json.loads(r.stdout)["error"].startswith(f"platform '{bad}' holds ','")
