"""How ranks start: the local launcher spawns them (torchrun-style) and runs the sampler."""
