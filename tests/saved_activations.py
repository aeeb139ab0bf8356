"""Measure what the kit's megatron model really saves for backward, to check the estimator.

Run as ``python -m tests.saved_activations WORKLOAD.yaml...`` (one rank over gloo on the cpu
platform). For each workload it builds the engine, runs one micro-batch forward with the loss
under ``torch.autograd.graph.saved_tensors_hooks`` and counts every distinct storage saved for
backward that is not a parameter (a saved view keeps its whole storage alive, as on a GPU).
Prints one JSON line per workload: ``{"workload", "saved_bytes", "estimated_bytes"}``, the
estimate being the stage's activations plus logits from :mod:`kit.plan.memory`.
"""

import json
import os
import sys

import torch

from kit.engines.megatron.engine import MegatronEngine
from kit.plan.memory import estimate_memory
from kit.plan.resolve import RunRequest, resolve

# Storages under this size are per-token statistics (norm rstd, attention log-sum-exp), which
# the estimator leaves out by design.
_SMALL_BYTES = 4096


def saved_bytes(workload: str) -> dict[str, object]:
    """Saved-for-backward bytes of one forward of ``workload`` beside the estimate."""
    cfg = resolve(RunRequest(workload=workload, platform="cpu"))
    engine = MegatronEngine()
    engine.setup(cfg, rank=0, local_rank=0, world_size=1)
    try:
        model = engine.model[0]
        params = {q.untyped_storage().data_ptr() for q in model.parameters()}
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in params and storage.nbytes() > _SMALL_BYTES:
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        batch = engine.data.micro_batch(0, 0, 1)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    finally:
        engine.teardown()
    stage = estimate_memory(cfg).stages[0]
    return {"workload": cfg.workload.name, "saved_bytes": sum(seen.values()),
            "estimated_bytes": stage.activations_bytes + stage.logits_bytes}


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    for path in sys.argv[1:]:
        print(json.dumps(saved_bytes(path)), flush=True)
