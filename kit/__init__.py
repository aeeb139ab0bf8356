"""charllm-kit: a vendor-neutral kit that characterizes distributed LLM training.

Importing ``kit`` loads no training engine and no vendor library; those are imported lazily
where they are used, so ``charllm-kit --help`` works on any laptop.
"""

__version__ = "0.1.0"
