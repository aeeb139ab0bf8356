"""Process setup DeepSpeed needs before it starts: its accelerator, op cache and CPU comm.

* ``DS_ACCELERATOR=cpu`` on the cpu platform (set before the first ``import deepspeed``):
  DeepSpeed otherwise probes for an accelerator and warns; on GPUs it detects CUDA (also ROCm
  builds) by itself.
* ``TORCH_EXTENSIONS_DIR``: DeepSpeed compiles some C++ ops just in time on first use
  (``--offload`` builds ``cpu_adam``, ~1 min on 2 cores). The builds are cached in this
  directory, by default ``~/.cache/charllm-kit/torch_extensions`` (torch adds a
  per-python/per-build subdirectory), so only a host's first run pays for them. A value
  already in the environment wins.
* On the CPU accelerator DeepSpeed's torch communication backend compiles its shared-memory
  op (``deepspeed_shm_comm``, 1-3 min on 2 cores) at every fresh host's first init. DeepSpeed
  uses that op only for ``inference_all_reduce`` (tensor-parallel inference, which falls back
  to ``torch.distributed.all_reduce`` without it); training never calls it. The kit therefore
  tells the backend there is no such op, which changes no training collective.
"""

import importlib
import os
from pathlib import Path

DEFAULT_EXTENSIONS_DIR = Path.home() / ".cache" / "charllm-kit" / "torch_extensions"


def prepare_deepspeed_environment(cpu: bool) -> None:
    """Set DeepSpeed's accelerator and op build cache; on CPU skip its inference-only comm op."""
    if cpu:
        os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(DEFAULT_EXTENSIONS_DIR))
    if cpu:
        # importlib, not ``import deepspeed.comm.torch as m``: that binds the ``torch`` name
        # which deepspeed.comm re-exports, i.e. the torch package itself.
        ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
        ds_torch_comm.build_shm_op = lambda: None
