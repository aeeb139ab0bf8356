"""PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) over the kit's plain model."""
