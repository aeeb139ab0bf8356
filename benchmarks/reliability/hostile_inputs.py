"""Issue 39: what each crafted input of a hostile sender costs the receiver, and what it prints.

Run from the repository root, CPU only:

    PYTHONPATH=$PWD python benchmarks/reliability/hostile_inputs.py \
        > benchmarks/reliability/results/hostile-inputs.txt

Each case builds its input on the fly in a temporary folder (the large ones, a 30-million-row
parquet and a gigabyte of gzip'd zeros, are never committed), runs one ``charllm-kit`` command
on it under ``/usr/bin/time`` and records the command, its exit code, what it printed, its peak
resident memory and its wall time.
"""

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.hostile_bundles import (  # noqa: E402  (after the path above)
    H200,
    billion_laughs,
    constant_rows,
    copy_bundle,
    edit_json,
    laughing_sweep,
    long_strings,
    reseal,
    zeros_archive,
)
from tests.test_bundle_redact import LOG, SBATCH, SEEDS, _seed  # noqa: E402


def run(args: list[str], cwd: Path) -> tuple[int, str, float, float]:
    """Run ``charllm-kit ARGS``: (exit code, what it printed, peak RSS MiB, wall seconds).

    The peak comes from ``/usr/bin/time -f %M``, which starts the command from its own small
    process: a child forked straight from this one (which holds the crafted tables) would count
    this process's pages in its ``ru_maxrss`` until it execs.
    """
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with tempfile.NamedTemporaryFile(mode="r") as peak, tempfile.TemporaryFile() as out:
        start = time.monotonic()
        code = subprocess.run(["/usr/bin/time", "-q", "-f", "%M", "-o", peak.name,
                               sys.executable, "-m", "kit", *args], cwd=cwd, env=env,
                              stdout=out, stderr=subprocess.STDOUT).returncode
        wall = time.monotonic() - start
        out.seek(0)
        text = out.read().decode("utf-8", "backslashreplace")
        peak_kib = int(peak.read().split()[-1])
    return code, text, peak_kib / 1024, wall


def shown(text: str, head: bool, lines: int = 6) -> str:
    """The first (``head``) or last ``lines`` lines, control characters as escapes (this file is
    read in terminals)."""
    all_lines = text.rstrip("\n").splitlines()
    tail = all_lines[:lines] if head else all_lines[-lines:]
    return "\n".join("    " + repr(line)[1:-1] for line in tail) or "    (nothing)"


def bundle_with(tmp: Path, change: Callable[[Path], Path]) -> Path:
    """A copy of the committed H200 bundle under ``tmp``, changed by ``change``."""
    return change(copy_bundle(tmp))


def cases(tmp: Path) -> list[tuple[str, Callable[[], list[str]]]]:
    """(what was crafted, a function that crafts it and returns the command's arguments)."""
    def sub(name: str) -> Path:
        path = tmp / name
        path.mkdir()
        return path

    def constant_verify() -> list[str]:
        return ["bundle", "verify", str(bundle_with(sub("rows"), lambda b: constant_rows(
            b, 30_000_000)))]

    def constant_unpack() -> list[str]:
        bundle = next((tmp / "rows").iterdir())
        archive = zeros_archive(tmp / "rows.tar.gz", bundle, 0, None)
        return ["bundle", "unpack", str(archive), "-o", str(tmp / "rows-in")]

    def strings_verify() -> list[str]:
        return ["bundle", "verify", str(bundle_with(sub("strings"), lambda b: long_strings(
            b, rows=40_000, length=100_000)))]

    def bomb(declared: int | None) -> Callable[[], list[str]]:
        def make() -> list[str]:
            archive = zeros_archive(tmp / f"bomb-{declared}.tar.gz", H200, 2**30, declared)
            return ["bundle", "unpack", str(archive), "-o", str(tmp / f"bomb-{declared}-in")]
        return make

    def yaml_file(name: str, text: str, *args: str) -> Callable[[], list[str]]:
        def make() -> list[str]:
            path = tmp / name
            path.write_text(text)
            return [*args[:1], str(path), *args[1:]]
        return make

    big = (REPO / "workloads/gpt3-tiny.yaml").read_text()
    big += "# padding line of a workload file made large on purpose\n" * 180_000

    def hostile_platform(env: dict[str, str], name: str = "cpu") -> Callable[[], list[str]]:
        def make() -> list[str]:
            import yaml
            spec = yaml.safe_load((REPO / "platforms/cpu.yaml").read_text())
            spec.update(name=name, env=env)
            path = tmp / f"platform-{len(list(tmp.glob('platform-*')))}.yaml"
            path.write_text(yaml.safe_dump(spec))
            return ["submit", "gpt3-tiny", "--platform", str(path), "--container-runtime",
                    "none", "--out", str(tmp / "o"), "--dry-run"]
        return make

    def mistyped(name: str, file: str, change: Callable[[dict], None],
                 command: str) -> Callable[[], list[str]]:
        def make() -> list[str]:
            bundle = edit_json(copy_bundle(sub(name)), file, change)
            if command == "report":
                return ["report", str(bundle), "-o", str(tmp / f"{name}.html")]
            return [*command.split(), str(bundle)]
        return make

    def deep(m: dict) -> None:
        inner = m["config"]
        for _ in range(900):
            inner["a"] = {}
            inner = inner["a"]

    def escapes(m: dict) -> None:
        m.update(status="failed", error="\x1b[2K\r\x1b[32mstatus ok (verified)\x1b[0m"
                                        "\x1b]0;window title\x07")

    def script(m: dict) -> None:
        m["workload"]["name"] = "=HYPERLINK(\"http://x\")<script>alert(1)</script>"
        m.update(status="failed", error="<img src=x onerror=alert(2)>")

    def sweep_folder(where: str) -> Callable[[], list[str]]:
        def make() -> list[str]:
            folder = sub(f"sweep-{len(list(tmp.glob('sweep-*')))}")
            (folder / "sweep.json").write_text(json.dumps({
                "name": "s", "sweep_file": "s.yaml", "updated_utc": "2026-11-27T00:00:00Z",
                "points": [{"id": "p1", "values": {}, "status": "ok", "bundle": where}]}))
            return ["compare", str(folder)]
        return make

    def newline_file() -> list[str]:
        bundle = reseal(copy_bundle(sub("names")))
        (bundle / "logs" / "a\u2028b.log").write_text("x")
        (bundle / "logs" / "c\nd.log").write_text("x")
        return ["bundle", "verify", str(bundle)]

    def redact() -> list[str]:
        bundle = copy_bundle(sub("redact"))
        (bundle / "job").mkdir()
        (bundle / "job" / "sbatch.sh").write_text(SBATCH)
        with (bundle / "logs" / "rank0.log").open("a") as log:
            log.write(LOG)
        edit_json(bundle, "manifest.json", _seed)
        return ["bundle", "pack", str(bundle), "--redact", "--redact-partitions", "-o",
                str(tmp / "redacted.tar.gz")]

    return [
        ("baseline: the committed H200 bundle, unchanged (what starting the kit costs on this "
         "host)", lambda: ["bundle", "verify", str(H200)]),
        ("telemetry.parquet of 30,000,000 constant rows (checksums valid)", constant_verify),
        ("the same bundle packed (index and checksums valid)", constant_unpack),
        ("telemetry.parquet whose source column is one 100,000-character word on 40,000 rows "
         "(4 GB decoded, dictionary-encoded)", strings_verify),
        ("archive: the bundle plus 1 GiB of zeros, index declaring the true total", bomb(None)),
        ("archive: the bundle plus 1 GiB of zeros, index declaring 100,000 bytes", bomb(100_000)),
        ("sweep file: billion-laughs anchors in an axis value",
         yaml_file("laughs.yaml", laughing_sweep(9), "sweep", "--dry-run", "--out",
                   str(tmp / "s"))),
        ("YAML file: billion-laughs anchors as a workload",
         yaml_file("laughs-w.yaml", billion_laughs(9), "run", "--dry-run")),
        ("sweep constraint if: \"'x' * 20000000000 == tp\"",
         yaml_file("mul.yaml", "base: {workload: gpt3-tiny}\nskip_if: [{if: \"'x' * "
                   "20000000000 == tp\", reason: x}]\n", "sweep", "--dry-run", "--out",
                   str(tmp / "s"))),
        ("workload YAML of 10 MB", yaml_file("big.yaml", big, "run", "--dry-run")),
        ("platform env key 'X=1; touch /tmp/PWNED; Y'",
         hostile_platform({"X=1; touch /tmp/PWNED; Y": "v"})),
        ("platform name with a newline and a command",
         hostile_platform({}, "cpu\ntouch /tmp/PWNED")),
        ("submit --partition with a newline", lambda: [
            "submit", "gpt3-tiny", "--container-runtime", "none", "--partition",
            "gpu\ntouch /tmp/PWNED", "--out", str(tmp / "o"), "--dry-run"]),
        ("submit --time abc", lambda: [
            "submit", "gpt3-tiny", "--container-runtime", "none", "--time", "abc", "--out",
            str(tmp / "o"), "--dry-run"]),
        ("submit --out with $(...), quotes and spaces (accepted, quoted)", lambda: [
            "submit", "gpt3-tiny", "--container-runtime", "none", "--out",
            str(tmp / "o $(touch PWNED) \"q\" 'r'"), "--dry-run"]),
        ("manifest config.engine null", mistyped("engine", "manifest.json",
                                                 lambda m: m["config"].update(engine=None),
                                                 "report")),
        ("metrics stragglers.slowest_rank a string", mistyped(
            "slowest", "metrics.json", lambda m: m.update(stragglers={"slowest_rank": "x"}),
            "report")),
        ("metrics per_rank[0].mem_peak_bytes a string", mistyped(
            "mempeak", "metrics.json", lambda m: m["per_rank"][0].update(mem_peak_bytes="x"),
            "bundle show")),
        ("a 900-deep dict under manifest config", mistyped("deep", "manifest.json", deep,
                                                           "bundle show")),
        ("manifest.error with terminal escapes (erase line, green 'ok', window title)",
         mistyped("escapes", "manifest.json", escapes, "bundle show")),
        ("workload name with <script> and a =HYPERLINK formula: compare --format markdown",
         mistyped("md", "manifest.json", script, "compare --format markdown")),
        ("the same: compare --format csv", mistyped("csv", "manifest.json", script,
                                                    "compare --format csv")),
        ("sweep.json naming the bundle /etc", sweep_folder("/etc")),
        ("sweep.json naming the bundle ../../elsewhere", sweep_folder("../../elsewhere")),
        ("bundle files named with U+2028 and a newline", newline_file),
        ("bundle seeded with secrets, accounts, partitions, users, e-mails, hosts, node lists, "
         "IPs, GPU UUIDs and serials: pack --redact --redact-partitions", redact),
    ]


def main() -> None:
    """Run every case and print the record."""
    print("# Hostile inputs (issue 39): command, exit code, output, peak memory, time")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, python {sys.version.split()[0]}"
          f", {os.cpu_count()} CPUs; generated by benchmarks/reliability/hostile_inputs.py\n")
    with tempfile.TemporaryDirectory(prefix="hostile-") as name:
        tmp = Path(name)
        for n, (what, make) in enumerate(cases(tmp), 1):
            args = make()
            code, text, peak_mib, wall = run(args, tmp)
            command = " ".join(a if a.isprintable() and " " not in a else repr(a) for a in args)
            print(f"## {n}. {what}\n$ charllm-kit {command.replace(str(tmp), '$TMP')}")
            print(shown(text.replace(str(tmp), "$TMP"), head=args[:2] == ["bundle", "show"]))
            print(f"  exit {code}, peak {peak_mib:.0f} MiB, {wall:.1f} s")
            if what.startswith("bundle seeded"):
                data = gzip.decompress((tmp / "redacted.tar.gz").read_bytes()).lower()
                left = [k for k, s in SEEDS.items() if s.lower().encode() in data]
                print(f"  seeds left in the archive: {left or 'none'} of {len(SEEDS)}")
            if "PWNED" in what or "touch" in command:
                made = [*tmp.rglob("PWNED"), *Path("/tmp").glob("PWNED")]
                print(f"  marker files created: {made or 'none'}")
            print()
            shutil.rmtree(tmp / "rows-in", ignore_errors=True)


if __name__ == "__main__":
    main()
