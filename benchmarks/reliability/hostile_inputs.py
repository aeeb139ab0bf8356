"""Issue 39: what each crafted input of a hostile sender costs the receiver, and what it prints.

Run from the repository root, CPU only:

    PYTHONPATH=$PWD python benchmarks/reliability/hostile_inputs.py \
        > benchmarks/reliability/results/hostile-inputs.txt
    PYTHONPATH=$PWD python benchmarks/reliability/hostile_inputs.py --issue60 \
        >> benchmarks/reliability/results/hostile-inputs.txt

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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from kit.bundle.schema import STEPS_SCHEMA  # noqa: E402  (after the path above)
from kit.bundle.writer import SUMS_NAME  # noqa: E402
from tests.hostile_bundles import (  # noqa: E402
    H200,
    billion_laughs,
    chained_archive,
    chunk_fields,
    constant_rows,
    copy_bundle,
    edit_footer,
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


def reader_cases(tmp: Path) -> list[tuple[str, Callable[[], list[str]]]]:
    """Issue 60, items 2-5, 10 and 11: lying parquet footers, row groups, tables the readers
    overran, tar header chains, fifos, links and slowest ranks (``--issue60``)."""
    def steps_bundle(name: str, make: Callable[[Path], None]) -> Path:
        bundle = copy_bundle(tmp / name)
        make(bundle / "steps.parquet")
        return reseal(bundle)

    def row_groups(groups: int, rows: int) -> Callable[[Path], None]:
        def make(path: Path) -> None:
            first = pq.read_table(path).slice(0, 1).cast(STEPS_SCHEMA)
            block = first.take(pa.array(np.zeros(rows, dtype=np.int64)))
            with pq.ParquetWriter(path, STEPS_SCHEMA) as writer:
                for _ in range(groups):
                    writer.write_table(block)
        return make

    def footer_says_one_row(path: Path) -> None:
        row_groups(12, 5_000_000)(path)
        edit_footer(path, lambda footer: footer.update({3: (footer[3][0], 1)}))

    def shared_dictionary(length: int) -> Callable[[Path], None]:
        def make(path: Path) -> None:
            row = pq.read_table(path).slice(0, 1)
            row = row.set_column(2, "phase", pa.array(["m" * length])).cast(STEPS_SCHEMA)
            with pq.ParquetWriter(path, STEPS_SCHEMA, compression="zstd") as writer:
                for _ in range(10):
                    writer.write_table(row)
            edit_footer(path, lambda footer: [c.update({6: (c[6][0], 1)})
                                              for c in chunk_fields(footer)])
        return make

    def one_group_per_row(path: Path) -> None:
        first = pq.read_table(path).slice(0, 1).cast(STEPS_SCHEMA)
        pq.write_table(first.take(pa.array(np.zeros(50_000, dtype=np.int64))), path,
                       row_group_size=1)

    def verify(name: str, make: Callable[[Path], None], *command: str) -> Callable[[], list[str]]:
        def run_it() -> list[str]:
            bundle = steps_bundle(name, make) if not (tmp / name).exists() else next(
                (tmp / name).iterdir())
            return [*(command or ("bundle", "verify")), str(bundle)]
        return run_it

    def unpack(name: str) -> Callable[[], list[str]]:
        def make() -> list[str]:
            archive = zeros_archive(tmp / f"{name}.tar.gz", next((tmp / name).iterdir()), 0, None)
            return ["bundle", "unpack", str(archive), "-o", str(tmp / f"{name}-in")]
        return make

    def chain(kind: bytes) -> Callable[[], list[str]]:
        def make() -> list[str]:
            archive = chained_archive(tmp / f"chain-{kind.decode()}.tar.gz", kind, 2000)
            return ["bundle", "unpack", str(archive), "-o", str(tmp / "chain-in")]
        return make

    def fifo(*command: str) -> Callable[[], list[str]]:
        def make() -> list[str]:
            if not (tmp / "fifo").exists():
                bundle = copy_bundle(tmp / "fifo")
                os.mkfifo(bundle / "logs" / "pipe.log")
                with (bundle / SUMS_NAME).open("a") as sums:
                    sums.write(f"{'0' * 64}  logs/pipe.log\n")
            return [*command, str(next((tmp / "fifo").iterdir()))]
        return make

    def link_out() -> list[str]:
        folder = tmp / "received"
        copy_bundle(folder)
        (folder / "elsewhere").symlink_to(copy_bundle(tmp / "outside"))
        return ["compare", str(folder)]

    def slowest(value: object, per_rank: list, command: str) -> Callable[[], list[str]]:
        def make() -> list[str]:
            name = f"slowest-{len(list(tmp.glob('slowest-*')))}"
            bundle = edit_json(copy_bundle(tmp / name), "metrics.json", lambda m: m.update(
                stragglers={"slowest_rank": value, "stage": 0, "slowest_frac": 1.0,
                            "ranks_compared": 2, "lag_s_median": 0.1, "lag_s_p90": 0.2,
                            "lag_frac_median": 0.1, "per_rank": per_rank}))
            if command == "report":
                return ["report", str(bundle), "-o", str(tmp / f"{name}.html")]
            return ["compare", str(bundle)]
        return make

    rank0 = [{"rank": 0, "stage": 0, "steps": 4, "slowest_steps": 4}]
    return [
        ("steps.parquet: 12 row groups of 5,000,000 rows, the footer saying num_rows=1",
         verify("one-row", footer_says_one_row)),
        ("steps.parquet: 10 one-row groups, each with a 300 MB dictionary page, the footer "
         "saying every chunk decodes to 1 byte", verify("dict300", shared_dictionary(300 * 2**20))),
        ("the same packed (index and checksums valid)", unpack("dict300")),
        ("steps.parquet: the same with 30 MB dictionary pages (under the 64 MiB cap: counted "
         "ten times, 0.29 GiB, charged 3x within the 4 GiB budget: accepted)",
         verify("dict30", shared_dictionary(30 * 2**20))),
        ("steps.parquet: 25,000,000 rows (in 25 row groups)",
         verify("rows25m", row_groups(25, 1_000_000))),
        ("the same: bundle show", verify("rows25m", row_groups(25, 1_000_000), "bundle", "show")),
        ("the same: compare", verify("rows25m", row_groups(25, 1_000_000), "compare")),
        ("steps.parquet: 50,000 one-row groups", verify("groups50k", one_group_per_row)),
        ("the same packed", unpack("groups50k")),
        ("archive: 2,000 chained pax x headers", chain(b"x")),
        ("archive: 2,000 chained pax g headers", chain(b"g")),
        ("archive: 2,000 chained GNU L headers", chain(b"L")),
        ("a fifo listed in SHA256SUMS: bundle verify", fifo("bundle", "verify")),
        ("the same: compare", fifo("compare")),
        ("a folder compared holding a link to a bundle outside it", link_out),
        ("stragglers.slowest_rank 'x': compare", slowest("x", rank0, "compare")),
        ("stragglers.slowest_rank -1: report", slowest(-1, rank0, "report")),
        ("stragglers.slowest_rank 0, per_rank empty: compare", slowest(0, [], "compare")),
    ]


def main() -> None:
    """Run every case and print the record (with ``--issue60``: only :func:`reader_cases`)."""
    issue60 = "--issue60" in sys.argv[1:]
    print(f"# Hostile inputs (issue {60 if issue60 else 39}): command, exit code, output, "
          "peak memory, time")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, python {sys.version.split()[0]}"
          f", {os.cpu_count()} CPUs; generated by benchmarks/reliability/hostile_inputs.py"
          f"{' --issue60' if issue60 else ''}\n")
    with tempfile.TemporaryDirectory(prefix="hostile-") as name:
        tmp = Path(name)
        for n, (what, make) in enumerate((reader_cases if issue60 else cases)(tmp), 1):
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
