"""``run --profile``: a torch.profiler trace of one training step per rank, into the bundle.

The profiled step is the last warmup step, so the measured steps keep their timing; with no
warmup it is the first measured step, and the rank notes that its time includes the
profiler's overhead. Each rank writes ``profile/rank<N>.json`` (Chrome trace format, what
``kit.analysis.kernels`` and ``charllm-kit report`` read).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from kit.spec.run import RunConfig

PROFILE_DIR = "profile"


def profiled_step(cfg: RunConfig) -> int | None:
    """Index of the step to profile, or None when the run does not profile."""
    if not cfg.profile:
        return None
    return cfg.warmup - 1 if cfg.warmup else 0


@contextmanager
def step_trace(staging: Path, rank: int) -> Iterator[None]:
    """Profile the enclosed step (CPU operators, and CUDA kernels on a GPU) and export it."""
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        yield
    folder = staging / PROFILE_DIR
    folder.mkdir(exist_ok=True)
    prof.export_chrome_trace(str(folder / f"rank{rank}.json"))
