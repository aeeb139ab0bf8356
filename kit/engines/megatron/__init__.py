"""The megatron-core engine: the kit's reference training back end."""
