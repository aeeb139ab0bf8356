"""Bundles, archives and spec files from a hostile sender: every reader keeps to its budget,
every output is neutralized, and every refusal is one ``error:`` line with exit code 2.

The commands run in this process through the console entry point (``kit.cli.commands.main``),
which is what ``charllm-kit`` runs, so a few hundred fuzzed bundles take seconds, not minutes.
"""

import csv
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kit.bundle import parquet_pages
from kit.bundle.archive import ArchiveLimits
from kit.bundle.budget import BUDGET_ENV
from kit.bundle.schema import STEPS_SCHEMA
from kit.bundle.telemetry_fields import TELEMETRY_SCHEMA
from kit.bundle.unpack import MAX_EXTENSION_HEADERS, unpack_bundle
from kit.bundle.writer import write_sums
from kit.errors import BundleError
from tests.hostile_bundles import (
    H200,
    chained_archive,
    chunk_fields,
    constant_rows,
    copy_bundle,
    edit_footer,
    edit_json,
    kit,
    laughing_sweep,
    long_strings,
    many_row_groups,
    one_error,
    reseal,
    zeros_archive,
)

REPO = Path(__file__).resolve().parent.parent


def test_a_table_of_millions_of_constant_rows_is_refused_from_its_footer(
        monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(BUDGET_ENV, "0.05")
    bundle = constant_rows(copy_bundle(tmp_path), 1_000_000)
    assert (bundle / "telemetry.parquet").stat().st_size < 1_000_000
    for command in (["bundle", "verify"], ["bundle", "show"], ["compare"]):
        line = one_error(*kit(monkeypatch, capsys, *command, str(bundle))[::2])
        assert "telemetry.parquet has 1000000 rows in 1 row groups" in line and BUDGET_ENV in line


def test_strings_that_decode_past_the_budget_are_refused_before_expanding(
        monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(BUDGET_ENV, "0.05")
    bundle = long_strings(copy_bundle(tmp_path), rows=2000, length=50_000)
    line = one_error(*kit(monkeypatch, capsys, "bundle", "verify", str(bundle))[::2])
    assert "has strings that take it to" in line


@pytest.mark.parametrize(("declared", "needle"), [
    (None, "may unpack to"),      # the truth, but far more than an archive this small holds
    (1000, "members add up to over the 1000 bytes bundle-archive.json declares"),
])
def test_unpack_refuses_a_zip_bomb_before_writing_it(tmp_path, declared, needle):
    archive = zeros_archive(tmp_path / "bomb.tar.gz", H200, 64 * 2**20, declared)
    assert archive.stat().st_size < 2**20
    dest = tmp_path / "in"
    with pytest.raises(BundleError, match=needle):
        unpack_bundle(archive, dest, ArchiveLimits(free_bytes=2**20))
    assert not dest.exists()


def test_unpack_refuses_a_declared_total_the_files_do_not_add_up_to(tmp_path):
    archive = zeros_archive(tmp_path / "a.tar.gz", H200, 10, None)  # an unlisted file
    with pytest.raises(BundleError, match="unlisted file|add up to"):
        unpack_bundle(archive, tmp_path / "in")
    assert not (tmp_path / "in").exists()


@pytest.mark.parametrize(("text", "needle"), [
    ("name: w\n" + "# padding\n" * 200_000, "too large for a spec file"),
    (laughing_sweep(9), "expands to over 100000 values"),
    ("base: " + "[" * 200 + "]" * 200 + "\n", "nests deeper than 32 levels"),
    ("base: {workload: gpt3-tiny}\nskip_if: [{if: \"'x' * 20000000000 == tp\", reason: x}]\n",
     "arithmetic takes numbers, not 'x'"),
    ("base: {workload: gpt3-tiny}\nskip_if: [{if: 'tp * 99999999999999999999 > 1', "
     "reason: x}]\n", "a literal beyond"),
])
def test_spec_files_over_their_budget_are_refused_in_one_line(
        monkeypatch, capsys, tmp_path, text, needle):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    line = one_error(*kit(monkeypatch, capsys, "sweep", str(path), "--dry-run",
                          "--out", str(tmp_path / "out"))[::2])
    assert needle in line, line
    assert not (tmp_path / "out").exists()


def _deep(manifest: dict) -> None:
    inner = manifest["config"]
    for _ in range(900):
        inner["a"] = {}
        inner = inner["a"]


MISTYPED = {
    "null engine": ("manifest.json", lambda m: m["config"].update(engine=None)),
    "string slowest_rank": ("metrics.json", lambda m: m.update(stragglers={
        "slowest_rank": "x", "stage": "y", "slowest_frac": "z"})),
    "string mem_peak_bytes": ("metrics.json",
                              lambda m: m["per_rank"][0].update(mem_peak_bytes="x")),
    "900-deep config": ("manifest.json", _deep),
}


@pytest.mark.parametrize("case", sorted(MISTYPED))
def test_schema_valid_but_mistyped_bundles_end_in_one_error_line(
        monkeypatch, capsys, tmp_path, case):
    name, change = MISTYPED[case]
    bundle = edit_json(copy_bundle(tmp_path), name, change)
    for command in (["bundle", "show"], ["compare", "--format", "json"],
                    ["report", "-o", str(tmp_path / "r.html")],
                    ["report", "--markdown", "-o", str(tmp_path / "r.md")]):
        code, _, err = kit(monkeypatch, capsys, *command, str(bundle))
        assert code == 0 or one_error(code, err), (command, err)


ESCAPES = "\x1b[2K\r\x1b[32mstatus ok (verified)\x1b[0m\x1b]0;owned\x07\u2028\u202e"


def test_bundle_show_escapes_terminal_sequences(monkeypatch, capsys, tmp_path):
    bundle = edit_json(copy_bundle(tmp_path), "manifest.json",
                       lambda m: m.update(status="failed", error=ESCAPES))
    code, out, _ = kit(monkeypatch, capsys, "bundle", "show", str(bundle))
    assert code == 0
    assert not any(c in out for c in "\x1b\r\x07\u2028\u202e")
    assert "\\x1b[2K\\x0d\\x1b[32mstatus ok (verified)" in out


SCRIPT = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def test_markdown_escapes_html_and_csv_defuses_formulas(monkeypatch, capsys, tmp_path):
    bundle = edit_json(copy_bundle(tmp_path), "manifest.json", lambda m: (
        m["workload"].update(name="=HYPERLINK(\"http://x\")" + SCRIPT),
        m.update(status="failed", error=SCRIPT)))
    code, out, _ = kit(monkeypatch, capsys, "compare", "--format", "markdown", str(bundle))
    assert code == 0 and "<script" not in out and "<img" not in out and "&lt;script&gt;" in out
    report = tmp_path / "r.md"
    code, _, err = kit(monkeypatch, capsys, "report", "--markdown", "-o", str(report),
                       str(bundle))
    assert code == 0, err
    text = report.read_text()
    assert "<script" not in text and "<img" not in text and '<a id="comparison"></a>' in text
    code, out, _ = kit(monkeypatch, capsys, "compare", "--format", "csv", str(bundle))
    cells = [c for row in csv.reader(io.StringIO(out)) for c in row]
    assert code == 0 and any(c.startswith("'=HYPERLINK") for c in cells)
    assert not [c for c in cells if c[:1] in "=+@" or (c[:1] == "-" and not _number(c))]


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("where", ["/etc", "../../elsewhere", "a/../../..", "x\ny"])
def test_sweep_index_bundle_paths_must_stay_inside_the_folder(
        monkeypatch, capsys, tmp_path, where):
    folder = tmp_path / "sweep"
    folder.mkdir()
    index = {"name": "s", "sweep_file": "s.yaml", "updated_utc": "2026-11-27T00:00:00Z",
             "points": [{"id": "p1", "values": {}, "status": "ok", "bundle": where}]}
    (folder / "sweep.json").write_text(json.dumps(index))
    for command in (["compare"], ["bundle", "show"]):
        code, _, err = kit(monkeypatch, capsys, *command, str(folder))
        assert "not a path inside the sweep folder" in one_error(code, err)


@pytest.mark.parametrize("name", ["a\nb.log", "a\u2028b.log", "a\rb.log"])
def test_file_names_that_would_break_sha256sums_are_refused(monkeypatch, capsys, tmp_path,
                                                            name):
    bundle = reseal(copy_bundle(tmp_path))
    (bundle / "logs" / name).write_text("x")
    with pytest.raises(BundleError, match="control character"):
        write_sums(bundle)
    line = one_error(*kit(monkeypatch, capsys, "bundle", "verify", str(bundle))[::2])
    assert "control character" in line and "\n" not in line[:-1]


_ODD_VALUES = [None, "x", -1, 1e308, [], {}, True, 2**70, "\x1b]0;t\x07", [None], {"a": None}]


def _json_paths(value: object, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [path] + [p for k, v in value.items() for p in _json_paths(v, (*path, k))]
    if isinstance(value, list):
        return [path] + [p for i, v in enumerate(value) for p in _json_paths(v, (*path, i))]
    return [path]


def _mutate_json(rng: random.Random, root: Path) -> None:
    name = rng.choice(["manifest.json", "metrics.json"])
    data = json.loads((root / name).read_text())
    path = rng.choice([p for p in _json_paths(data) if p])
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if rng.random() < 0.2 and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(_ODD_VALUES)
    (root / name).write_text(json.dumps(data))


def _mutate_bytes(rng: random.Random, root: Path) -> None:
    name = rng.choice(["steps.parquet", "telemetry.parquet"])
    data = bytearray((root / name).read_bytes())
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(data))
        data[i] = rng.randrange(256)
    if rng.random() < 0.2:
        data = data[:rng.randrange(len(data))]
    (root / name).write_bytes(bytes(data))


@pytest.mark.timeout(300)
def test_fuzzed_bundles_never_end_in_a_traceback(monkeypatch, capsys, tmp_path):
    """300 seeded mutations (JSON values retyped or removed, parquet bytes flipped or cut),
    each resealed so that only the mutation can get it refused."""
    rng = random.Random(39)
    pristine = copy_bundle(tmp_path / "pristine")
    outcomes = {0: 0, 2: 0}
    for n in range(300):
        bundle = copy_bundle(tmp_path / f"m{n}", pristine)
        (_mutate_json if n % 3 else _mutate_bytes)(rng, bundle)
        reseal(bundle)
        commands = [["bundle", "verify"], ["bundle", "show"]]
        if n % 3 == 1:
            commands.append(["compare", "--format", "csv"])
        for command in commands:
            code, _, err = kit(monkeypatch, capsys, *command, str(bundle))
            assert code == 0 or one_error(code, err), (n, command, err)
            outcomes[code] += 1
    assert outcomes[0] and outcomes[2]  # mutations both pass and get refused


@pytest.mark.parametrize("slowest, per_rank", [("x", None), (-1, None), (0, [])])
def test_a_slowest_rank_that_names_no_rank_ends_in_one_error_line(
        monkeypatch, capsys, tmp_path, slowest, per_rank):
    def change(m: dict) -> None:
        m["stragglers"] = {"slowest_rank": slowest, "stage": 0, "slowest_frac": 1.0,
                           "ranks_compared": 2, "lag_s_median": 0.1, "lag_s_p90": 0.2,
                           "lag_frac_median": 0.1,
                           "per_rank": per_rank if per_rank is not None else [
                               {"rank": 0, "stage": 0, "steps": 4, "slowest_steps": 4}]}
    bundle = edit_json(copy_bundle(tmp_path), "metrics.json", change)
    for command in (["compare"], ["report", "-o", str(tmp_path / "r.html")]):
        line = one_error(*kit(monkeypatch, capsys, *command, str(bundle))[::2])
        assert f"stragglers.slowest_rank {slowest!r} names no rank" in line, line


def test_compare_of_a_folder_refuses_a_link_that_leaves_it(monkeypatch, capsys, tmp_path):
    outside = copy_bundle(tmp_path / "elsewhere")
    folder = tmp_path / "received"
    copy_bundle(folder)
    (folder / "zz-link").symlink_to(outside, target_is_directory=True)
    line = one_error(*kit(monkeypatch, capsys, "compare", str(folder))[::2])
    assert "zz-link is a link to a place outside the folder" in line
    (folder / "zz-link").unlink()
    code, _, err = kit(monkeypatch, capsys, "compare", str(folder))
    assert code == 0, err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [["bundle", "verify"], ["compare"], ["bundle", "show"]])
def test_a_fifo_listed_in_sha256sums_is_refused_without_opening_it(
        monkeypatch, capsys, tmp_path, command):
    bundle = copy_bundle(tmp_path)
    os.mkfifo(bundle / "logs" / "pipe.log")
    with (bundle / "SHA256SUMS").open("a") as sums:
        sums.write(f"{'0' * 64}  logs/pipe.log\n")
    line = one_error(*kit(monkeypatch, capsys, *command, str(bundle))[::2])
    assert "logs/pipe.log is a special file" in line


@pytest.mark.parametrize("kind", [b"x", b"g", b"L"])
def test_unpack_cuts_a_chain_of_extension_headers(monkeypatch, capsys, tmp_path, kind):
    archive = chained_archive(tmp_path / "chain.tar.gz", kind, 2000)
    assert archive.stat().st_size < 10_000
    line = one_error(*kit(monkeypatch, capsys, "bundle", "unpack", str(archive), "-o",
                          str(tmp_path / "in"))[::2])
    assert "over 8 extension headers (pax or GNU long-name) in a row" in line
    assert not (tmp_path / "in").exists()
    short = chained_archive(tmp_path / "short.tar.gz", kind, 8)  # as many as a packer may write
    line = one_error(*kit(monkeypatch, capsys, "bundle", "unpack", str(short), "-o",
                          str(tmp_path / "in"))[::2])
    assert "extension headers" not in line


def _steps_row_groups(tmp_path: Path, groups: int, rows: int, **options) -> Path:
    return many_row_groups(copy_bundle(tmp_path), "steps.parquet", groups, rows, STEPS_SCHEMA,
                           **options)


READERS = (["bundle", "verify"], ["bundle", "show"], ["compare"])


@pytest.mark.parametrize("lie", ["file", "row group"])
def test_row_counts_are_taken_from_what_is_read_not_from_the_footer(
        monkeypatch, capsys, tmp_path, lie):
    bundle = _steps_row_groups(tmp_path, groups=4, rows=100_000)

    def understate(footer: dict) -> None:
        footer[3] = (footer[3][0], 1)
        if lie == "row group":
            for group in footer[4][1][1]:
                group[3] = (group[3][0], 1)
        chunks = chunk_fields(footer)
        for chunk in chunks:
            chunk[6] = (chunk[6][0], 1)  # total_uncompressed_size
    edit_footer(bundle / "steps.parquet", understate)
    reseal(bundle)
    needle = ("the footer declares 1 rows, its row groups 400000" if lie == "file" else
              "row group 0 declares 1 rows, but the pages of its column 0 hold 100000 values")
    for command in READERS:
        line = one_error(*kit(monkeypatch, capsys, *command, str(bundle))[::2])
        assert f"steps.parquet is not readable parquet (PagesError: {needle})" in line, line
    archive = zeros_archive(tmp_path / "a.tar.gz", bundle, 0, None)
    line = one_error(*kit(monkeypatch, capsys, "bundle", "unpack", str(archive), "-o",
                          str(tmp_path / "in"))[::2])
    assert needle in line and not (tmp_path / "in").exists()


def _long_phase(tmp_path: Path, groups: int, length: int) -> Path:
    """steps.parquet of ``groups`` one-row groups whose phase is one ``length``-character
    word, each group's dictionary page holding it, the footer saying every chunk decodes to
    1 byte."""
    bundle = copy_bundle(tmp_path)
    row = pq.read_table(bundle / "steps.parquet").slice(0, 1)
    row = row.set_column(row.schema.get_field_index("phase"), "phase",
                         pa.array(["m" * length], pa.string())).cast(STEPS_SCHEMA)
    with pq.ParquetWriter(bundle / "steps.parquet", STEPS_SCHEMA, compression="zstd") as w:
        for _ in range(groups):
            w.write_table(row)

    def understate(footer: dict) -> None:
        for chunk in chunk_fields(footer):
            chunk[6] = (chunk[6][0], 1)
    edit_footer(bundle / "steps.parquet", understate)
    return reseal(bundle)


def test_dictionary_pages_are_counted_as_read_in_every_row_group(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(BUDGET_ENV, "0.05")
    bundle = _long_phase(tmp_path, groups=10, length=2**22)
    assert (bundle / "steps.parquet").stat().st_size < 100_000
    for command in READERS:
        line = one_error(*kit(monkeypatch, capsys, *command, str(bundle))[::2])
        assert "steps.parquet has 10 rows in 10 row groups, 0.04 GiB decoded" in line, line
    monkeypatch.setattr(parquet_pages, "MAX_DICTIONARY_PAGE_BYTES", 2**20)
    line = one_error(*kit(monkeypatch, capsys, "bundle", "verify", str(bundle))[::2])
    assert "row group 0 column 2: a dictionary page of 4194308 bytes, over the 1048576" in line


def test_row_groups_and_footers_are_capped(monkeypatch, capsys, tmp_path):
    bundle = _steps_row_groups(tmp_path, groups=1100, rows=1)
    archive = zeros_archive(tmp_path / "a.tar.gz", bundle, 0, None)
    for command in [*READERS, ["bundle", "unpack", str(archive), "-o", str(tmp_path / "in")]]:
        line = one_error(*kit(monkeypatch, capsys, *command,
                              *([] if "unpack" in command else [str(bundle)]))[::2])
        assert "steps.parquet: 1100 row groups, over the 1024 a table may have" in line, line
    assert not (tmp_path / "in").exists()
    monkeypatch.setattr(parquet_pages, "MAX_FOOTER_BYTES", 64 * 1024)
    line = one_error(*kit(monkeypatch, capsys, "bundle", "verify", str(bundle))[::2])
    assert "steps.parquet: a footer of" in line and "bytes, over the 65536 read" in line, line


def limited_kit(cases: list[dict], headroom_mib: float, timeout: float = 300) -> list[dict]:
    """Run ``cases`` (the first a warm-up) in one child whose memory is capped at what it
    holds after the warm-up plus ``headroom_mib`` (tests/limited_kit.py): one result each."""
    done = subprocess.run([sys.executable, "-m", "tests.limited_kit", str(headroom_mib)],
                          input=json.dumps(cases), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def _long_steps(tmp_path: Path, rows: int) -> Path:
    """steps.parquet of ``rows`` rows (the bundle's 23 repeated, step numbers distinct)."""
    bundle = copy_bundle(tmp_path)
    first = pq.read_table(bundle / "steps.parquet")
    table = first.take(pa.array(np.arange(rows) % first.num_rows))
    table = table.set_column(0, "step", pa.array(np.arange(rows, dtype=np.int32)))
    pq.write_table(table.cast(STEPS_SCHEMA), bundle / "steps.parquet")
    return reseal(bundle)


@pytest.mark.timeout(600)
def test_what_verify_accepts_every_reader_holds_within_the_budget(tmp_path):
    """The budget covers the readers' copies, not just the table: a steps table just under a
    third of it is read by verify, show and compare within the budget (the child's memory
    capped there); one of 2.4 million rows, which passed verify at its decoded size until
    2026-12-07 while show then took 2.5 times that, is refused by every reader in one line."""
    budget = {BUDGET_ENV: "0.25"}
    fits = _long_steps(tmp_path / "fits", 1_100_000)
    over = _long_steps(tmp_path / "over", 2_400_000)
    readers = [["bundle", "verify"], ["bundle", "show"], ["compare", "--format", "json"]]
    cases = [{"argv": ["bundle", "verify", str(H200)], "env": {}}]
    cases += [{"argv": [*r, str(b)], "env": budget} for b in (fits, over) for r in readers]
    results = limited_kit(cases, headroom_mib=0.25 * 1024)
    for result in results[:3]:
        assert result["code"] == 0, result["err"]
    for result in results[3:]:
        line = one_error(result["code"], result["err"])
        assert "steps.parquet has 2400000 rows in 3 row groups" in line, line
        assert "3 times that (its readers' copies) is over the 0.25 GiB" in line


def _fuzz_footer(rng: random.Random, bundle: Path) -> None:
    """Row groups of the steps table whose footer understates or overstates rows."""
    groups, rows = rng.randint(1, 5), rng.randint(1, 50_000)
    many_row_groups(bundle, "steps.parquet", groups, rows, STEPS_SCHEMA)
    lie = rng.choice([0, 1, -1, rows * groups + rng.randint(1, 9), 2**40, rows // 2])
    lie = lie if lie != rows * groups else 0

    def change(footer: dict) -> None:
        if rng.random() < 0.5:
            footer[3] = (footer[3][0], lie)
        else:
            group = rng.choice(footer[4][1][1])
            group[3] = (group[3][0], lie if lie != rows else rows + 1)
        for chunk in chunk_fields(footer):
            if rng.random() < 0.5:
                chunk[6] = (chunk[6][0], rng.choice([0, 1, 2**31]))
    edit_footer(bundle / "steps.parquet", change)


def _fuzz_dictionary(rng: random.Random, bundle: Path) -> None:
    """One-row groups whose phase is a 3-4 MiB word, the footer saying each chunk is tiny."""
    row = pq.read_table(bundle / "steps.parquet").slice(0, 1)
    word = pa.array([rng.choice("mwx") * rng.randint(3 * 2**20, 4 * 2**20)], pa.string())
    row = row.set_column(2, "phase", word).cast(STEPS_SCHEMA)
    with pq.ParquetWriter(bundle / "steps.parquet", STEPS_SCHEMA, compression="zstd") as w:
        for _ in range(rng.randint(6, 12)):
            w.write_table(row)

    def understate(footer: dict) -> None:
        for chunk in chunk_fields(footer):
            chunk[6] = (chunk[6][0], rng.randint(0, 100))
    edit_footer(bundle / "steps.parquet", understate)


def _fuzz_row_groups(rng: random.Random, bundle: Path) -> None:
    many_row_groups(bundle, "steps.parquet", rng.randint(1025, 1300), 1, STEPS_SCHEMA)


def _fuzz_special(rng: random.Random, bundle: Path) -> None:
    where = bundle / rng.choice(["logs", "."]) / rng.choice(["p.log", "q", "z.parquet"])
    os.mkfifo(where)
    if rng.random() < 0.7:
        with (bundle / "SHA256SUMS").open("a") as sums:
            sums.write(f"{'0' * 64}  {where.relative_to(bundle).as_posix()}\n")


def _fuzz_slowest(rng: random.Random, bundle: Path) -> None:
    value = rng.choice(["x", "", -1, -(2**40), 10**6, 2**70, 0.5, [], {}, [0]])
    per_rank = [] if rng.random() < 0.3 else [
        {"rank": r, "stage": 0, "steps": 4, "slowest_steps": 1} for r in range(rng.randint(1, 4))]
    edit_json(bundle, "metrics.json", lambda m: m.update(stragglers={
        "slowest_rank": value, "stage": 0, "slowest_frac": 0.5, "ranks_compared": 2,
        "lag_s_median": 0.1, "lag_s_p90": 0.2, "lag_frac_median": 0.1, "per_rank": per_rank}))


BUNDLE_FAMILIES = {"footer": _fuzz_footer, "dictionary": _fuzz_dictionary,
                   "row groups": _fuzz_row_groups, "special file": _fuzz_special,
                   "slowest rank": _fuzz_slowest}
"""Hostile bundles by family (issue 60): each makes a copy of the H200 bundle one that every
reader must refuse."""


def _fuzz_cases(rng: random.Random, tmp: Path, n: int) -> list[tuple[str, dict, Path | None]]:
    """(family, case for tests/limited_kit.py, a folder that must not exist afterwards)."""
    family = rng.choice([*BUNDLE_FAMILIES, "tar chain", "unpack", "folder link"])
    case = tmp / f"c{n}"
    budget = {BUDGET_ENV: "0.05"}
    if family == "tar chain":
        archive = chained_archive(case.with_suffix(".tar.gz"), rng.choice([b"x", b"g", b"L"]),
                                  rng.randint(MAX_EXTENSION_HEADERS + 1, 3000))
        return [(family, {"argv": ["bundle", "unpack", str(archive), "-o", str(case)],
                          "env": {}}, case)]
    if family == "folder link":
        case.mkdir()
        (case / "a-link").symlink_to(H200, target_is_directory=True)
        return [(family, {"argv": ["compare", str(case)], "env": {}}, None)]
    bundle = copy_bundle(case)
    kind = rng.choice(["footer", "row groups"]) if family == "unpack" else family
    BUNDLE_FAMILIES[kind](rng, bundle)
    if kind not in ("slowest rank", "special file"):  # those edit SHA256SUMS themselves
        reseal(bundle)
    if family == "unpack":
        archive = zeros_archive(case / "a.tar.gz", bundle, 0, None)
        dest = case / "in"
        return [(family, {"argv": ["bundle", "unpack", str(archive), "-o", str(dest)],
                          "env": budget}, dest)]
    commands = [["bundle", "verify"], ["bundle", "show"], ["compare", "--format",
                                                           rng.choice(["json", "csv", "text"])]]
    if kind == "slowest rank":  # the formats that name the slowest rank
        commands = [["compare", "--format", rng.choice(["text", "markdown"])]]
    return [(family, {"argv": [*c, str(bundle)], "env": budget}, None) for c in commands]


@pytest.mark.timeout(600)
def test_seeded_fuzz_of_hostile_families_ends_in_one_line_within_memory(tmp_path):
    """A few hundred seeded cases of the families of issue 60 (lying parquet footers, shared
    dictionaries, row groups past the cap, tar header chains, fifos, slowest ranks that name
    no rank, links out of a compared folder), run in children capped at 512 MiB over what the
    kit holds after start (tests/limited_kit.py): each ends in one ``error:`` line with exit
    code 2 (never out of memory), and leaves no file behind."""
    rng = random.Random(60)
    cases: list[tuple[str, dict, Path | None]] = []
    for n in range(120):
        cases += _fuzz_cases(rng, tmp_path, n)
    before = {p for p in tmp_path.rglob("*")}
    warm = {"argv": ["bundle", "verify", str(H200)], "env": {}}
    results = []
    for start in range(0, len(cases), 100):
        batch = cases[start:start + 100]
        results += limited_kit([warm, *[c for _, c, _ in batch]], headroom_mib=512)
    assert len(results) == len(cases) >= 200
    for (family, case, gone), result in zip(cases, results, strict=True):
        line = one_error(result["code"], result["err"])
        assert "out of memory" not in line and "Traceback" not in line, (family, case, line)
        assert gone is None or not gone.exists(), (family, case)
    assert {p for p in tmp_path.rglob("*")} == before  # nothing written, no staging left
    assert {f for f, _, _ in cases} == {*BUNDLE_FAMILIES, "tar chain", "unpack", "folder link"}


def test_an_empty_table_is_walked_as_pyarrow_writes_it(monkeypatch, capsys, tmp_path):
    """pyarrow writes an empty table's chunks with data_page_offset 0 (no data page): a CPU
    run's telemetry is one, and must verify."""
    bundle = copy_bundle(tmp_path)
    pq.write_table(TELEMETRY_SCHEMA.empty_table(), bundle / "telemetry.parquet")
    code, _, err = kit(monkeypatch, capsys, "bundle", "verify", str(reseal(bundle)))
    assert code == 0, err
