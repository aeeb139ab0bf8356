"""A command line given --json gets every error as one JSON object on stdout, exit 2: click's
usage errors (bad values, unknown options, a missing argument) as well as the kit's own."""

import json

import pytest


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args, needle", [
    (["run", "gpt3-tiny", "--steps", "0", "--json"], "Invalid value for '--steps'"),
    (["run", "gpt3-tiny", "--json", "--engine", "nope"], "unknown engine 'nope'; known:"),
    (["run", "gpt3-tiny", "--bogus", "--json"], "No such option '--bogus'"),
    (["run", "--json"], "Missing argument 'WORKLOAD'"),
    (["run", "nonesuch", "--json"], "unknown workload 'nonesuch'"),
    (["run", "gpt3-tiny", "--tp", "3", "--dry-run", "--json"], "must be divisible by --tp 3"),
])
def test_json_errors_are_one_object_on_stdout(cli, args, needle):
    r = cli(*args, timeout=120)
    assert r.returncode == 2 and r.stderr == ""
    assert r.stdout.count("\n") == 1 and needle in json.loads(r.stdout)["error"]


@pytest.mark.timeout(120)
def test_json_error_for_an_output_path_under_a_file(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = cli("run", "gpt3-tiny", "--json", "--out", str(blocker / "results"), timeout=120)
    assert r.returncode == 2 and r.stderr == ""
    assert json.loads(r.stdout) == {
        "error": f"cannot write {blocker / 'results'}: {blocker} is not a directory"}


@pytest.mark.timeout(120)
def test_without_json_the_error_is_one_line_on_stderr(cli):
    r = cli("run", "gpt3-tiny", "--steps", "0", timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("error: Invalid value for '--steps': '0' is not an integer from 1 to "
                        "100000000\n")
