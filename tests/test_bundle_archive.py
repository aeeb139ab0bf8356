"""`bundle pack|unpack` through the CLI: round trip, hostile archives refused, --redact."""

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from kit.bundle.archive import INDEX_NAME, ArchiveLimits
from kit.bundle.pack import pack_bundle
from kit.bundle.unpack import unpack_bundle
from kit.errors import BundleError

from .conftest import REPO, why_failed

H100 = REPO / "tests/data/bundles/telemetry/20261125T122448Z-gpt3-1.3b-h100-f4a12c"
H200 = REPO / "tests/data/bundles/telemetry/20261122T094842Z-gpt3-1.3b-h200-bceb8a"
"""A real GPU bundle that verifies: the one the archive tests pack."""
EVIL_ID = "20261122T000000Z-gpt3-tiny-cpu-000000"


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def rehash(bundle: Path) -> None:
    """Rewrite SHA256SUMS after editing a bundle, as a careless or hostile sender would."""
    files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != "SHA256SUMS")
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(bundle).as_posix()}"
             for p in files]
    (bundle / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def one_line_error(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    return lines[0]


def test_pack_unpack_round_trip_is_exact_and_reproducible(cli, cpu_bundle, tmp_path):
    r = cli("bundle", "pack", str(cpu_bundle), "-o", str(tmp_path / "a.tar.gz"))
    assert r.returncode == 0, why_failed(r)
    archive = Path(r.stdout.strip())
    assert archive == tmp_path / "a.tar.gz"
    assert archive.read_bytes() == pack_bundle(cpu_bundle, tmp_path / "b.tar.gz").read_bytes()

    r = cli("bundle", "unpack", str(archive), "-o", str(tmp_path / "in"))
    assert r.returncode == 0, why_failed(r)
    unpacked = Path(r.stdout.strip())
    assert unpacked == tmp_path / "in" / cpu_bundle.name
    assert tree(unpacked) == tree(cpu_bundle)
    assert [p.name for p in (tmp_path / "in").iterdir()] == [cpu_bundle.name]  # no staging left
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile(INDEX_NAME))
        assert {m.uname for m in tar.getmembers()} == {""}  # no user names travel
    assert index["manifest_sha256"] == hashlib.sha256(
        (cpu_bundle / "manifest.json").read_bytes()).hexdigest()

    r = cli("bundle", "unpack", str(archive), "-o", str(tmp_path / "in"))
    assert "already exists" in one_line_error(r)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_the_archive_is_readable_as_the_umask_says(cli, tmp_path, umask, mode):
    """An archive is for sharing: the mode a new file gets, not a temporary file's 0600."""
    archive = tmp_path / "a.tar.gz"
    r = cli("bundle", "pack", str(H100), "-o", str(archive), umask=umask)
    assert r.returncode == 0, why_failed(r)
    assert stat.S_IMODE(archive.stat().st_mode) == mode


def test_recorded_gpu_bundles_round_trip(tmp_path):
    for bundle in sorted(H100.parent.iterdir()):
        archive = pack_bundle(bundle, tmp_path / f"{bundle.name}.tar.gz")
        assert tree(unpack_bundle(archive, tmp_path / "in")) == tree(bundle)


def test_pack_refuses_a_bundle_that_does_not_verify(cli, cpu_bundle, tmp_path):
    copy = shutil.copytree(cpu_bundle, tmp_path / cpu_bundle.name)
    (copy / "logs" / "rank1.log").write_text("edited\n")
    r = cli("bundle", "pack", str(copy), "-o", str(tmp_path / "x.tar.gz"))
    assert "logs/rank1.log" in one_line_error(r) and not (tmp_path / "x.tar.gz").exists()


def test_unpack_refuses_a_bundle_changed_after_packing(cli, tmp_path):
    """Consistent edits with rewritten sums still break the manifest hash in the index."""
    archive = tmp_path / "a.tar.gz"
    assert cli("bundle", "pack", str(H200), "-o", str(archive)).returncode == 0
    work = tmp_path / "work"
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    manifest = json.loads((work / H200.name / "manifest.json").read_text())
    manifest["kit_version"] = "9.9.9"
    (work / H200.name / "manifest.json").write_text(json.dumps(manifest))
    rehash(work / H200.name)
    forged = tmp_path / "forged.tar.gz"
    with tarfile.open(forged, "w:gz") as tar:
        tar.add(work / INDEX_NAME, INDEX_NAME)
        tar.add(work / H200.name, H200.name)
    r = cli("bundle", "unpack", str(forged), "-o", str(tmp_path / "in"))
    assert "manifest.json does not match the hash" in one_line_error(r)
    assert not (tmp_path / "in").exists()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, io.BytesIO(data)


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3
    return info, None


def _index(schema_version: int = 1) -> tuple[tarfile.TarInfo, io.BytesIO]:
    data = json.dumps({"bundle_id": EVIL_ID, "schema_version": schema_version,
                       "manifest_sha256": "0" * 64, "sums_sha256": "0" * 64,
                       "redacted": False}).encode()
    return _file(INDEX_NAME, data)


def write_archive(path: Path, members: list[tuple[tarfile.TarInfo, io.BytesIO | None]],
                  tail: bytes = b"", schema_version: int = 1) -> Path:
    """A gzip tar of ``members`` after a valid index; ``tail`` is raw bytes appended unclosed."""
    raw = io.BytesIO()
    tar = tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT)
    for info, data in [_index(schema_version), *members]:
        tar.addfile(info, data)
    if tail:
        raw.write(tail)
    else:
        tar.close()
    path.write_bytes(gzip.compress(raw.getvalue()))
    return path


def huge_member_tail() -> bytes:
    """A header claiming a 1 TiB file, followed by a few bytes: a bomb that is never read."""
    info = tarfile.TarInfo(f"{EVIL_ID}/telemetry.parquet")
    info.size = 2**40
    return info.tobuf(format=tarfile.PAX_FORMAT) + b"\0" * 1024


EVIL: dict[str, tuple[Callable[[Path], list], str]] = {
    "path traversal": (lambda t: [_file("../escaped")], "leaves the target"),
    "absolute path": (lambda t: [_file(str(t / "escaped"))], "absolute path"),
    "symlink": (lambda t: [_special(f"{EVIL_ID}/link", tarfile.SYMTYPE, "/etc/passwd")],
                "symlink"),
    "hardlink": (lambda t: [_special(f"{EVIL_ID}/link", tarfile.LNKTYPE, "/etc/passwd")],
                 "hard link"),
    "device file": (lambda t: [_special(f"{EVIL_ID}/null", tarfile.CHRTYPE)], "device file"),
}
MORE_EVIL: dict[str, tuple[Callable[[Path], list], str]] = {
    "nested traversal": (lambda t: [_file(f"{EVIL_ID}/../../escaped")], "leaves the target"),
    "outside the bundle": (lambda t: [_file("other/escaped")], f"outside {EVIL_ID}/"),
    "fifo": (lambda t: [_special(f"{EVIL_ID}/pipe", tarfile.FIFOTYPE)], "fifo"),
    "duplicate": (lambda t: [_file(f"{EVIL_ID}/a"), _file(f"{EVIL_ID}/a")], "appears twice"),
}


@pytest.mark.parametrize("case", sorted(EVIL))
def test_unpack_refuses_hostile_members_and_writes_nothing(cli, tmp_path, case):
    make, needle = EVIL[case]
    archive = write_archive(tmp_path / "evil.tar.gz", make(tmp_path))
    r = cli("bundle", "unpack", str(archive), "-o", str(tmp_path / "in"))
    assert needle in one_line_error(r)
    assert [p.name for p in tmp_path.iterdir()] == ["evil.tar.gz"]
    assert not (tmp_path.parent / "escaped").exists()


@pytest.mark.parametrize("case", sorted(MORE_EVIL))
def test_unpack_api_refuses_more_hostile_members(tmp_path, case):
    make, needle = MORE_EVIL[case]
    archive = write_archive(tmp_path / "evil.tar.gz", make(tmp_path))
    with pytest.raises(BundleError, match=needle):
        unpack_bundle(archive, tmp_path / "in")
    assert [p.name for p in tmp_path.iterdir()] == ["evil.tar.gz"]


def test_unpack_refuses_a_huge_member_from_its_header(cli, tmp_path):
    archive = write_archive(tmp_path / "bomb.tar.gz", [], tail=huge_member_tail())
    r = cli("bundle", "unpack", str(archive), "-o", str(tmp_path / "in"))
    assert "over the 8589934592-byte limit per file" in one_line_error(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.tar.gz"]


def test_unpack_refuses_a_huge_pax_header_before_tarfile_reads_it(cli, tmp_path):
    """tarfile reads a pax header whole: one declaring 16 GiB must not be read at all."""
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, 16 * 2**30
    tail = header.tobuf(format=tarfile.GNU_FORMAT) + b"\0" * 4096
    archive = write_archive(tmp_path / "pax.tar.gz", [], tail=tail)
    r = cli("bundle", "unpack", str(archive), "-o", str(tmp_path / "in"))
    assert "a member header is over" in one_line_error(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pax.tar.gz"]


def test_unpack_refuses_too_many_members(cli, tmp_path):
    limit = ArchiveLimits().max_members
    dirs = [_special(f"{EVIL_ID}/d{i}", tarfile.DIRTYPE) for i in range(limit + 1)]
    archive = write_archive(tmp_path / "many.tar.gz", [(_special(EVIL_ID, tarfile.DIRTYPE))]
                            + dirs)
    r = cli("bundle", "unpack", str(archive), "-o", str(tmp_path / "in"))
    assert f"more than {limit} members" in one_line_error(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.tar.gz"]


def test_unpack_refuses_what_is_not_a_bundle_archive(cli, tmp_path):
    (tmp_path / "junk.tar.gz").write_bytes(b"not gzip at all")
    r = cli("bundle", "unpack", str(tmp_path / "junk.tar.gz"), "-o", str(tmp_path / "in"))
    assert "not a readable .tar.gz" in one_line_error(r)
    plain = tmp_path / "plain.tar.gz"
    with tarfile.open(plain, "w:gz") as tar:
        tar.addfile(*_file("README"))
    r = cli("bundle", "unpack", str(plain), "-o", str(tmp_path / "in"))
    assert f"first member is not {INDEX_NAME}" in one_line_error(r)
    assert not (tmp_path / "in").exists()


def test_unpack_limits_total_size(tmp_path):
    archive = tmp_path / "a.tar.gz"
    pack_bundle(H200, archive)
    with pytest.raises(BundleError, match="over the 50000 bytes an archive of"):
        unpack_bundle(archive, tmp_path / "in", ArchiveLimits(max_total_bytes=50_000))
    assert not (tmp_path / "in").exists()
    assert unpack_bundle(archive, tmp_path / "in").name == H200.name


def _unshare_tmpfs_works(tmp_path: Path) -> bool:
    """Whether this host lets us mount a tmpfs in a private user and mount namespace."""
    if shutil.which("unshare") is None:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    r = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs tmpfs {probe}"],
                       capture_output=True, timeout=30)
    probe.rmdir()
    return r.returncode == 0


@pytest.mark.timeout(120)
def test_unpack_into_a_directory_without_write_permission_names_it(cli, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into a mode-555 directory anyway; see the tmpfs tests")
    archive = pack_bundle(H100, tmp_path / "ok.tar.gz")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    r = cli("bundle", "unpack", str(archive), "-o", str(locked))
    assert one_line_error(r) == f"error: cannot write {locked}: {locked} is not writable"


@pytest.mark.timeout(120)
def test_unpack_under_a_file_names_the_destination(cli, tmp_path):
    archive = pack_bundle(H100, tmp_path / "ok.tar.gz")
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = cli("bundle", "unpack", str(archive), "-o", str(blocker / "in"))
    assert one_line_error(r) == (f"error: cannot write {blocker / 'in'}: {blocker} is not a "
                                 "directory")
    with pytest.raises(BundleError) as e:  # the API, without the CLI's check up front
        unpack_bundle(archive, blocker / "in")
    assert str(e.value).startswith(f"cannot unpack into {blocker / 'in'}: Not a directory")
    assert str(archive) not in str(e.value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("options, needle", [
    ("size=8k", "error: cannot unpack into {dest}: No space left on device; not unpacked"),
    ("ro", "error: cannot write {dest}: {mnt} is not writable"),
])
def test_unpack_onto_a_full_or_read_only_filesystem_names_the_destination(tmp_path, options,
                                                                        needle):
    """A real tmpfs, full or read-only, which root cannot write past either."""
    if not _unshare_tmpfs_works(tmp_path):
        pytest.skip("cannot mount a tmpfs here (unshare -rm with tmpfs not permitted)")
    archive = pack_bundle(H100, tmp_path / "ok.tar.gz")
    mnt, dest = tmp_path / "mnt", tmp_path / "mnt" / "in"
    mnt.mkdir()
    script = (f"mount -t tmpfs -o {options} tmpfs {mnt} && cd {REPO} && "
              f"{sys.executable} -m kit bundle unpack {archive} -o {dest}; "
              f"rc=$?; ls -A {mnt}; exit $rc")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                       timeout=100)
    assert r.stdout == ""  # nothing printed, nothing left on the tmpfs
    assert one_line_error(r).startswith(needle.format(dest=dest, mnt=mnt))
    assert str(archive) not in r.stderr


@pytest.mark.timeout(120)
def test_pack_onto_a_read_only_filesystem_names_the_archive_not_its_temp_file(tmp_path):
    if not _unshare_tmpfs_works(tmp_path):
        pytest.skip("cannot mount a tmpfs here (unshare -rm with tmpfs not permitted)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    dest = mnt / "x.tar.gz"
    script = (f"mount -t tmpfs -o ro tmpfs {mnt} && cd {REPO} && "
              f"{sys.executable} -m kit bundle pack {H100} -o {dest}")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                       timeout=100)
    assert one_line_error(r) == f"error: {dest}: Read-only file system"


def test_a_tampered_archive_is_named_by_itself_not_by_a_deleted_staging_path(cli, tmp_path):
    """A member edited and SHA256SUMS left as packed: the bundle fails verification once
    extracted, and the one line names the archive and the bundle's file, not the staging
    folder it was checked in (deleted by the time the line is read)."""
    archive = tmp_path / "a.tar.gz"
    assert cli("bundle", "pack", str(H200), "-o", str(archive)).returncode == 0
    work = tmp_path / "work"
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    metrics = work / H200.name / "metrics.json"  # one byte changed, the size kept (the index
    text = metrics.read_text()                    # declares the archive's total bytes)
    metrics.write_text(text[:-1] + (" " if text[-1] != " " else "\n"))
    tampered = tmp_path / "tampered.tar.gz"
    with tarfile.open(tampered, "w:gz") as tar:
        tar.add(work / INDEX_NAME, INDEX_NAME)
        tar.add(work / H200.name, H200.name)
    r = cli("bundle", "unpack", str(tampered), "-o", str(tmp_path / "in"))
    assert one_line_error(r) == (f"error: {tampered}: bundle {H200.name} fails verification: "
                                 "checksum mismatch: metrics.json; not unpacked")
    assert not (tmp_path / "in").exists()


PLANTED = ("gpu-node-17", "example.org", "alice", "10.20.30.40", "fd00::1234")


def test_redacted_pack_hides_hosts_users_and_ips_and_still_verifies(cli, cpu_bundle, tmp_path):
    bundle = shutil.copytree(cpu_bundle, tmp_path / "src" / cpu_bundle.name)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["inventory"][0]["host"] = "gpu-node-17"
    manifest["command"] += ["--out", "/home/alice/runs"]
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2))
    with (bundle / "logs" / "rank0.log").open("a") as log:
        log.write("rendezvous gpu-node-17.cluster.example.org 10.20.30.40:29500 via fd00::1234\n"
                  "USER=alice MASTER_ADDR=127.0.0.1\n")
    rehash(bundle)
    assert cli("bundle", "verify", str(bundle)).returncode == 0

    r = cli("bundle", "pack", str(bundle), "--redact", "-o", str(tmp_path / "r.tar.gz"))
    assert r.returncode == 0, why_failed(r)
    r = cli("bundle", "unpack", str(tmp_path / "r.tar.gz"), "-o", str(tmp_path / "in"))
    assert r.returncode == 0, why_failed(r)
    redacted = Path(r.stdout.strip())
    assert cli("bundle", "verify", str(redacted)).returncode == 0
    for rel, data in tree(redacted).items():
        for secret in PLANTED:
            assert secret.encode() not in data, (secret, rel)
    m = json.loads((redacted / "manifest.json").read_text())
    assert m["inventory"][0]["host"] == "node0" and "/home/<user>/runs" in m["command"]
    assert m["redaction"]["replacements"] >= 5
    log = (redacted / "logs" / "rank0.log").read_text()
    assert "rendezvous node0 <ip>:29500 via <ip>" in log and "MASTER_ADDR=127.0.0.1" in log
    assert tree(redacted)["steps.parquet"] == tree(bundle)["steps.parquet"]
    assert "gpu-node-17" in (bundle / "manifest.json").read_text()  # the original is untouched
