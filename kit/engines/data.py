"""Deterministic synthetic token data that a model can actually learn.

Each sample is an arithmetic progression modulo the vocabulary, ``x[i+1] = (x[i] + d) % V``,
with a random start and a stride ``d`` drawn from a small set. Loss therefore falls as the
model learns the rule, which shows a run really trains, while no tokenizer or data set is
needed. Batches depend only on (seed, step, micro-batch, data-parallel rank), so every
tensor-parallel peer of a replica sees the same tokens and equivalent layouts see the same data.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from kit.config.run import RunConfig

STRIDES = (1, 2, 3, 5, 7)


@dataclass(frozen=True)
class SyntheticTokens:
    """Synthetic batches for one data-parallel rank."""

    vocab_size: int
    seq_length: int
    micro_batch_size: int
    seed: int
    dp_rank: int
    dp_size: int

    @classmethod
    def of_run(cls, cfg: RunConfig, dp_rank: int) -> "SyntheticTokens":
        """The batches of data-parallel rank ``dp_rank`` of ``cfg``'s run."""
        return cls(vocab_size=cfg.workload.vocab_size, seq_length=cfg.workload.seq_length,
                   micro_batch_size=cfg.micro_batch_size, seed=cfg.seed, dp_rank=dp_rank,
                   dp_size=cfg.parallel.dp)

    def micro_batch(self, step: int, micro: int, num_micro: int) -> dict[str, torch.Tensor]:
        """Tokens, labels and position ids of one micro-batch, on the CPU."""
        index = (step * num_micro + micro) * self.dp_size + self.dp_rank
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        b, s = self.micro_batch_size, self.seq_length
        start = torch.randint(0, self.vocab_size, (b, 1), generator=gen)
        stride = torch.tensor(STRIDES)[torch.randint(0, len(STRIDES), (b, 1), generator=gen)]
        seq = (start + stride * torch.arange(s + 1)) % self.vocab_size
        return {
            "tokens": seq[:, :-1].contiguous(),
            "labels": seq[:, 1:].contiguous(),
            "position_ids": torch.arange(s).unsqueeze(0).expand(b, -1).contiguous(),
        }

    def step_iterator(
        self, step: int, num_micro: int, device: torch.device
    ) -> Iterator[dict[str, torch.Tensor]]:
        """The micro-batches of one optimizer step, moved to ``device``."""
        for m in range(num_micro):
            batch = self.micro_batch(step, m, num_micro)
            yield {k: v.to(device, non_blocking=True) for k, v in batch.items()}
