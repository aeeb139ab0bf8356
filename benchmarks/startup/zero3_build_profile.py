"""What DeepSpeed ZeRO-3's model build spends its time on, in one rank (issue 34).

The rank's ``model_build`` phase is ``DeepSpeedEngine.setup`` after the process group: the
model built under ``deepspeed.zero.Init`` and ``deepspeed.initialize``. This runs that setup
in this process as a world of one rank, after importing first, each timed on its own, what the
setup would otherwise import on the way (DeepSpeed's runtime, then ``torch._dynamo``, which
torch's optimizer imports at its first ``add_param_group``), so what is left is the build.
It prints those seconds, the setup's wall seconds, and the setup's functions under cProfile
ranked by cumulative time (cProfile slows Python-heavy parts; rank, do not add up).

    python benchmarks/startup/zero3_build_profile.py [--workload gpt3-1.3b] [--platform h100]
"""

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

from kit.engines import engine_spec
from kit.launch.worker import freeze_imported_objects
from kit.plan.resolve import RunRequest, resolve


def _timed(label: str, fn) -> None:  # type: ignore[no-untyped-def]
    t = time.time()
    fn()
    print(f"{label}: {time.time() - t:.2f} s", flush=True)


def main() -> None:
    """Time ZeRO-3's model build in one rank; print the profile."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="gpt3-tiny")
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="leave the imported objects to the collector (before the worker "
                             "froze them)")
    parser.add_argument("--no-cprofile", action="store_true",
                        help="only the wall seconds, the setup not slowed by cProfile")
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29571"),
                      RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    cfg = resolve(RunRequest(workload=args.workload, platform=args.platform, engine="deepspeed",
                             zero=3, micro_batch_size=1, global_batch_size=1, dp=1))
    engine = engine_spec("deepspeed").build()
    _timed("import deepspeed", lambda: engine.import_framework(cfg.platform.is_cpu))

    def runtime() -> None:
        import deepspeed.runtime.engine  # noqa: F401
        import deepspeed.runtime.zero.stage3  # noqa: F401

    _timed("import DeepSpeed's runtime (engine, ZeRO stage 3)", runtime)
    _timed("import torch._dynamo (torch's optimizer does at its first call)",
           lambda: __import__("torch._dynamo"))
    if not args.no_gc_freeze:
        freeze_imported_objects()  # as the worker does after its imports
    profile = cProfile.Profile()
    t = time.time()
    if not args.no_cprofile:
        profile.enable()
    engine.setup(cfg, rank=0, local_rank=0, world_size=1)
    if not cfg.platform.is_cpu:
        torch.cuda.synchronize()
    profile.disable()
    print(f"setup ({args.workload}, {args.platform}; the process group, the model built under "
          f"zero.Init, deepspeed.initialize): {time.time() - t:.2f} s"
          + ("" if args.no_cprofile else " under cProfile"), flush=True)
    if not args.no_cprofile:
        stats = pstats.Stats(profile, stream=sys.stdout)
        stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
