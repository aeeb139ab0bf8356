"""Issue 60 (items 1, 6, 7, 9): list arguments, shown text, bounds, Markdown; what each crafted
input costs and what the kit prints.

Run from the repository root, CPU only, appending to the record of hostile_inputs.py:

    PYTHONPATH=$PWD python benchmarks/reliability/hostile_text.py \
        >> benchmarks/reliability/results/hostile-inputs.txt

Each case crafts its input in a temporary folder and runs one ``charllm-kit`` command under
``/usr/bin/time`` (hostile_inputs.run): the command, its exit code, the last lines it printed
(control characters as escapes), its peak resident memory and its wall time.
"""

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_inputs import run, shown  # noqa: E402  (after the paths above)

from tests.hostile_bundles import copy_bundle, edit_json, reseal  # noqa: E402

ESCAPES = "\x1b]0;T\x07\x1b[2K\rok"
FORGED = "\n  - none: forged\tline\n# heading"
LINKS = " [x](javascript:alert(1)) ![](http://remote.example/p.png)"


SHOWN = {"%u": "#SBATCH --output", "sweep folder whose": "sweep folder", "sweep --dry-run":
         "constraint", "workloads show": "description", "no-pyxis": "warning", "1e-300":
         "ratio_to_baseline"}
"""Cases whose record shows the lines holding a word (case -> word), not the last lines."""


def cases(tmp: Path) -> list[tuple[str, Callable[[], list[str]]]]:
    """(what was crafted, a function that crafts it and returns the command's arguments)."""
    def platform(name: str, **fields: object) -> Path:
        data = yaml.safe_load((REPO / "platforms/h100.yaml").read_text())
        data.update(name="site", **fields)
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data))
        return path

    def workload(**fields: object) -> Path:
        data = yaml.safe_load((REPO / "workloads/gpt3-tiny.yaml").read_text())
        data.update(name="w", **fields)
        path = tmp / "w.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    def submit(*args: str) -> list[str]:
        return ["submit", "gpt3-tiny", "--global-batch", "16", *args, "--dry-run",
                "--out", str(tmp / "o")]

    def hostile_bundle(sub: str) -> Path:
        bundle = copy_bundle(tmp / sub)
        return edit_json(bundle, "manifest.json", lambda m: m["workload"].update(
            name="gpt" + ESCAPES + FORGED + LINKS))

    def sweep_file(name: str, body: dict) -> Path:
        path = tmp / name
        path.write_text(yaml.safe_dump(body))
        return path

    def mounted_sweep() -> list[str]:
        platform("a,/:/host:rw,/site.yaml", container_image="img")
        path = sweep_file("mount.yaml", {
            "name": "m", "base": {"workload": "gpt3-tiny", "global_batch_size": 16},
            "axes": [{"points": [{"platform": "a,/:/host:rw,/site.yaml"}]}]})
        return ["sweep", str(path), "--launcher", "slurm", "--container-runtime", "pyxis",
                "--dry-run", "--out", str(tmp / "o")]

    def percent_out() -> list[str]:
        return ["submit", "gpt3-tiny", "--global-batch", "16", "--container-runtime", "none",
                "--dry-run", "--out", str(tmp / "o%u")]

    def grid() -> list[str]:
        fields = ["tp", "pp", "cp", "ep", "steps", "warmup", "seed", "rdzv_timeout"]
        path = tmp / "grid.yaml"
        path.write_text("base: {workload: gpt3-tiny}\naxes:\n" + "".join(
            f"- product: {{{f}: [1,2,3,4,5,6,7,8,9,10]}}\n" for f in fields))
        return ["sweep", str(path), "--dry-run", "--out", str(tmp / "o")]

    def hostile_sweep() -> list[str]:
        path = sweep_file("hs.yaml", {
            "name": "hs", "base": {"workload": "gpt3-tiny", "platform": "cpu"},
            "axes": [{"points": [{"tp": 2, "speed": "compile" + ESCAPES + FORGED},
                                 {"tp": 1}]}],
            "skip_if": [{"when": {"tp": 1}, "reason": "r" + ESCAPES + FORGED}]})
        return ["sweep", str(path), "--dry-run", "--out", str(tmp / "o")]

    def sweep_folder() -> list[str]:
        folder = tmp / "sweepdir"
        folder.mkdir()
        (folder / "sweep.json").write_text(json.dumps({
            "schema_version": 1, "name": "s" + ESCAPES + FORGED, "sweep_file": "s.yaml",
            "updated_utc": "2026-12-07T00:00:00Z",
            "points": [{"id": "001", "values": {}, "status": "skipped", "reason": "r"}]}))
        return ["bundle", "show", str(folder)]

    def huge_metric() -> list[str]:
        bundle = copy_bundle(tmp / "inf")
        metrics = json.loads((bundle / "metrics.json").read_text())
        metrics["summary"]["extra"] = 1.0
        (bundle / "metrics.json").write_text(
            json.dumps(metrics).replace('"extra": 1.0', '"extra": 1e400'))
        reseal(bundle)
        return ["compare", "--format", "json", str(bundle)]

    def extreme_ratio() -> list[str]:
        base = edit_json(copy_bundle(tmp / "ra"), "metrics.json",
                         lambda m: m["summary"].update(tokens_per_s=1e-300))
        other = copy_bundle(tmp / "rb")
        edit_json(other, "manifest.json", lambda m: m["workload"].update(name="other"))
        edit_json(other, "metrics.json", lambda m: m["summary"].update(tokens_per_s=1e300))
        return ["compare", "--format", "json", str(base), str(other), "--baseline", str(base)]

    def no_pyxis() -> list[str]:
        stub = tmp / "bin" / "srun"
        stub.parent.mkdir()
        stub.write_text('#!/bin/sh\necho "Usage: srun [OPTIONS...] executable"\n')
        stub.chmod(0o755)
        os.environ["PATH"] = f"{stub.parent}:{os.environ['PATH']}"
        return submit("--platform", str(platform("np.yaml", container_image="img" + ESCAPES
                                                 + FORGED)))

    return [
        ("platform container_image 'img:1,LD_PRELOAD=/x.so,INJ=1', pyxis (srun --export list)",
         lambda: submit("--platform", str(platform("p1.yaml",
                                                   container_image="img:1,LD_PRELOAD=/x.so,INJ=1")),
                        "--container-runtime", "pyxis")),
        ("the same image, apptainer (--env list)",
         lambda: submit("--platform", str(platform("p2.yaml",
                                                   container_image="img:1,LD_PRELOAD=/x.so")),
                        "--container-runtime", "apptainer")),
        ("--image '--bind=/:/host' with apptainer (an option where the image goes)",
         lambda: submit("--platform", "h100", "--container-runtime", "apptainer",
                        "--image", "--bind=/:/host")),
        ("sweep point platform path 'a,/:/host:rw,/site.yaml' (pyxis --container-mounts)",
         mounted_sweep),
        ("--out holding %u (Slurm expands it in #SBATCH --output)", percent_out),
        ("compare (table) of a bundle whose workload name holds escapes, newlines, a tab, "
         "links", lambda: ["compare", str(hostile_bundle("t"))]),
        ("the same: compare --format csv", lambda: ["compare", "--format", "csv",
                                                    str(hostile_bundle("c"))]),
        ("the same: compare --format markdown", lambda: ["compare", "--format", "markdown",
                                                         str(hostile_bundle("m"))]),
        ("the same: report --markdown (file checked for links below)",
         lambda: ["report", str(hostile_bundle("r")), "--markdown", "-o", str(tmp / "r.md")]),
        ("bundle show of a sweep folder whose name holds escapes and newlines", sweep_folder),
        ("sweep --dry-run: skip_if reason and speed with escapes and newlines", hostile_sweep),
        ("run --dry-run: platform device_name and scaling reason with escapes and newlines",
         lambda: ["run", "gpt3-tiny", "--global-batch", "16", "--dry-run", "--platform",
                  str(platform("p3.yaml", device_name="H" + ESCAPES + FORGED,
                               scaling={"gpt3-tiny": {"reason": "why" + ESCAPES + FORGED,
                                                      "set": {"num_layers": 1}}}))]),
        ("workloads show: description with escapes and newlines",
         lambda: ["workloads", "show", str(workload(description="d" + ESCAPES + FORGED))]),
        ("submit's no-pyxis warning: container_image with escapes (stub srun without pyxis)",
         no_pyxis),
        ("sweep of 8 product axes x 10 values (10**8 points, a few hundred bytes)", grid),
        ("run --global-batch 10**400", lambda: ["run", "gpt3-tiny", "--global-batch",
                                                str(10**400), "--dry-run"]),
        ("workload global_batch_size: 10**400, submit",
         lambda: ["submit", str(workload(global_batch_size=10**400)), "--platform", "h100",
                  "--dry-run", "--out", str(tmp / "o")]),
        ("platform memory_per_device_gib: .inf",
         lambda: submit("--platform", str(platform("i1.yaml",
                                                   memory_per_device_gib=float("inf"))))),
        ("platform rank_overhead_gib: .inf",
         lambda: submit("--platform", str(platform("i2.yaml", rank_overhead_gib=float("inf"))))),
        ("platform multi_rank_margin_gib: 1e308",
         lambda: submit("--platform", str(platform("i3.yaml", multi_rank_margin_gib=1e308)))),
        ("metrics.json summary holding 1e400 (checksums valid)", huge_metric),
        ("compare --format json, tokens/s 1e300 against a baseline of 1e-300", extreme_ratio),
    ]


def main() -> None:
    """Run every case and print the record."""
    print(f"# Hostile inputs, second pass (issue 60, items 1, 6, 7, 9): "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs; generated by "
          "benchmarks/reliability/hostile_text.py\n")
    with tempfile.TemporaryDirectory(prefix="hostile-text-") as name:
        tmp = Path(name)
        for n, (what, make) in enumerate(cases(tmp), 1):
            args = make()
            code, text, peak_mib, wall = run(args, tmp)
            command = " ".join(a if a.isprintable() and " " not in a else repr(a) for a in args)
            print(f"## 60.{n}. {what}\n$ charllm-kit {command.replace(str(tmp), '$TMP')}")
            word = next((w for key, w in SHOWN.items() if key in what), None)
            if word is not None:
                text = "\n".join(line for line in text.splitlines() if word in line)
            print(shown(text.replace(str(tmp), "$TMP"), head=False, lines=4))
            print(f"  exit {code}, peak {peak_mib:.0f} MiB, {wall:.1f} s")
            if args[0] == "report":
                from markdown_it import MarkdownIt

                html = MarkdownIt("commonmark").enable("table").render(
                    (tmp / "r.md").read_text())
                left = [s for s in ('href="javascript', '<img src="http', "\x1b", "<h1>heading")
                        if s in html]
                print(f"  r.md rendered (CommonMark): script links, remote images, escapes, "
                      f"forged headings: {left or 'none'}")
            if args[:3] == ["compare", "--format", "json"] and code == 0:
                strict = not any(w in text for w in ("Infinity", "NaN"))
                print(f"  Infinity or NaN in the JSON: {'none' if strict else 'yes'}")
            print()


if __name__ == "__main__":
    main()
