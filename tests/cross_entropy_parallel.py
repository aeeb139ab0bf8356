"""The kit's vocab-parallel cross-entropy on 1 and 2 tensor-parallel ranks against torch's.

Run as ``python -m tests.cross_entropy_parallel PORT``: two processes over gloo each hold half
of the vocabulary; every rank compares its loss and its slice of the logits' gradient with
``torch.nn.functional.cross_entropy`` on the whole vocabulary (fp32), and so does one rank
without a group. Rank 0 prints one JSON line per check: ``{"check", "rel_err"}``.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from kit.engines.kernels.cross_entropy import vocab_parallel_cross_entropy

SEQ, BATCH, VOCAB = 16, 3, 64


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def _errors(group: dist.ProcessGroup | None, rank: int, size: int) -> list[float]:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(SEQ, BATCH, VOCAB, generator=gen) * 4
    target = torch.randint(0, VOCAB, (SEQ, BATCH), generator=gen)
    grad_loss = torch.rand(SEQ, BATCH, generator=gen)
    full = logits.clone().requires_grad_()
    want = F.cross_entropy(full.reshape(-1, VOCAB), target.reshape(-1), reduction="none")
    want = want.reshape(SEQ, BATCH)
    want.backward(grad_loss)
    width = VOCAB // size
    part = logits[..., rank * width:(rank + 1) * width].clone().requires_grad_()
    got = vocab_parallel_cross_entropy(part, target, group)
    got.backward(grad_loss)
    want_grad = full.grad[..., rank * width:(rank + 1) * width]
    return [_rel_err(got.detach(), want.detach()), _rel_err(part.grad, want_grad)]


def _rank(rank: int, port: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        loss_err, grad_err = _errors(dist.group.WORLD, rank, 2)
        errs = [torch.tensor([loss_err, grad_err])]
        gathered = [torch.zeros(2) for _ in range(2)]
        dist.all_gather(gathered, errs[0])
        if rank == 0:
            single = _errors(None, 0, 1)
            for name, (loss, grad) in (("one rank", single),
                                       ("tp2", torch.stack(gathered).amax(0).tolist())):
                print(json.dumps({"check": f"{name} loss", "rel_err": loss}))
                print(json.dumps({"check": f"{name} grad", "rel_err": grad}), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_rank, args=(sys.argv[1],), nprocs=2)
