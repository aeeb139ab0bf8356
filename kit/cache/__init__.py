"""What the kit keeps between runs: compiled kernels and bytecode.

``compile_cache`` is the folder of torch inductor, Triton and Python bytecode artifacts, keyed
by the versions torch cannot see; ``bytecode_precompile`` fills its bytecode folder in the
background while the ranks start. ``charllm-kit cache show|clear`` (kit/cli/cache.py) is how
users see it.
"""
