"""Run many ``charllm-kit`` commands in one child process whose memory is capped.

Started by tests/test_hostile_inputs.py as ``python -m tests.limited_kit HEADROOM_MIB`` with a
JSON list of cases on stdin, each ``{"argv": [...], "env": {...}}``. It first runs a warm-up
command (so that pyarrow's thread pools and allocator exist), then caps its data segment
(``RLIMIT_DATA``: heap and private mappings) at what it holds then plus ``HEADROOM_MIB``, then
runs every case in this process through the console entry point and prints one JSON line per
case: ``{"code": exit code, "err": stderr}``. A case that takes more memory than the headroom
ends in a ``MemoryError`` (an ``out of memory`` line) or kills the child: either way the test
sees it.
"""

import contextlib
import io
import json
import os
import resource
import sys

from kit.cli.commands import main


def run(argv: list[str], env: dict[str, str]) -> dict[str, object]:
    """One command: its exit code and what it wrote on stderr."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    sys.argv = ["charllm-kit", *argv]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"code": code, "err": err.getvalue()}


def data_bytes() -> int:
    """This process's data segment now (``VmData``), bytes."""
    with open("/proc/self/status") as status:
        line = next(ln for ln in status if ln.startswith("VmData:"))
    return int(line.split()[1]) * 1024


def limited() -> None:
    headroom = int(float(sys.argv[1]) * 2**20)
    cases = json.load(sys.stdin)
    warm = cases[0]
    run(warm["argv"], warm["env"])
    limit = data_bytes() + headroom
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    for case in cases[1:]:
        print(json.dumps(run(case["argv"], case["env"])), flush=True)


if __name__ == "__main__":
    limited()
