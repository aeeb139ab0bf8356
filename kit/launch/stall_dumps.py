"""What each rank arms at start-up so that a stalled run can be diagnosed from its bundle.

Before the launcher's stall watchdog (kit.launch.watchdog) kills a run whose ranks stopped
finishing steps, it asks every rank for two things:

* Every thread's Python stack, written into the rank's log by :mod:`faulthandler` on
  :data:`STACK_SIGNAL`. faulthandler writes from the C signal handler, so a rank answers while
  its main thread is blocked inside a collective, with or without the GIL; a stopped process
  (SIGSTOP, state T) answers only once it is continued.
* torch.distributed's flight recorder: the last collectives of each process group, each with
  its sequence number, operation and state (scheduled, started, completed), so the bundle says
  which collective each rank was in. A thread polls for the watchdog's record
  (``logs/`` :data:`STALL_RECORD`, which it writes first) and then writes the recorder as JSON
  to ``logs/rank<N>.flight-recorder.json`` (:func:`flight_recorder_path`): NCCL's recorder on
  an NCCL run, the backend-neutral one otherwise (torch 2.13 records gloo's collectives there).
  That thread needs the GIL, which a rank blocked in a collective has released.
  The recorder's ring size, ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (also read as
  ``TORCH_FR_BUFFER_SIZE``), is set before any process group exists unless the user set it:
  older torch releases record nothing without it.
"""

import faulthandler
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kit.atomic_write import write_atomic

STACK_SIGNAL = signal.SIGUSR1
"""The signal on which a rank writes every thread's Python stack into its log."""
STACK_MARK = b"(most recent call first)"
"""What faulthandler writes in the header of every thread's stack."""
STALL_RECORD = "stall-watchdog.json"
"""The watchdog's record in the bundle's ``logs/``; its appearance asks ranks for a dump."""
TRACE_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
TRACE_BUFFER_ENTRIES = "2000"
"""Flight recorder entries kept per rank (torch 2.13's default; older releases default to 0)."""
REQUEST_POLL_S = 0.5
"""How often a rank looks for the watchdog's record."""
LOGS_DIR = "logs"


def flight_recorder_path(logs_dir: Path, rank: int) -> Path:
    """Where ``rank`` writes its flight recorder when the watchdog asks."""
    return logs_dir / f"rank{rank}.flight-recorder.json"


def _recorder_dump() -> Callable[[], bytes] | None:
    """torch's JSON dump of the flight recorder of this process's backend, or None."""
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d

    nccl = dist.is_initialized() and dist.get_backend() == "nccl"
    names = ("_dump_nccl_trace_json", "_dump_fr_trace_json") if nccl else ("_dump_fr_trace_json",)
    for name in names:
        dump = getattr(c10d, name, None)
        if dump is not None:
            return lambda: _as_bytes(dump(includeCollectives=True, onlyActive=False))
    return None


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _write_recorder(out: Path) -> None:
    """Write the flight recorder to ``out``, or why there is none (the watchdog waits for it)."""
    try:
        dump = _recorder_dump()
        data = dump() if dump is not None else json.dumps(
            {"unavailable": "this torch build has no flight recorder dump"}).encode()
    except Exception as e:  # a dump must never take the rank down
        data = json.dumps({"unavailable": f"{type(e).__name__}: {e}"}).encode()
    write_atomic(out, lambda tmp: tmp.write_bytes(data))
    print(f"stall watchdog: flight recorder written to {out.name}", file=sys.stderr, flush=True)


def _await_request(request: Path, out: Path) -> None:
    while not request.exists():
        time.sleep(REQUEST_POLL_S)
    try:
        _write_recorder(out)
    except OSError as e:  # e.g. no space left: the stacks in the log remain
        print(f"stall watchdog: cannot write {out.name}: {e}", file=sys.stderr, flush=True)


def arm_stall_dumps(staging: Path, rank: int) -> None:
    """Make this rank answer the stall watchdog; call before any process group exists."""
    os.environ.setdefault(TRACE_BUFFER_ENV, TRACE_BUFFER_ENTRIES)
    faulthandler.register(STACK_SIGNAL, file=sys.stderr, all_threads=True)
    logs = staging / LOGS_DIR
    threading.Thread(target=_await_request, daemon=True, name="stall-dump",
                     args=(logs / STALL_RECORD, flight_recorder_path(logs, rank))).start()
