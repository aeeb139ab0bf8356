"""The DeepSpeed engine: the kit's workloads as plain PyTorch models under ZeRO or DeepSpeed PP."""
