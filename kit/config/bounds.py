"""Upper bounds of the numbers a workload, platform, run request or sweep may hold.

Each is far beyond any model or machine built so far, so no real file meets one, and far below
what breaks the arithmetic that follows: a ``global_batch_size`` of ``10**400`` does not
convert to a float, a ``memory_per_device_gib`` of ``.inf`` not to bytes, ``1e308`` GiB not to
bytes either. Floats must also be finite: the models that use these set ``allow_inf_nan=False``.
"""

MAX_RANKS = 2**20
"""Nodes, and each parallel degree (1,048,576: a hundred times today's largest jobs)."""
MAX_DEVICES_PER_NODE = 1024
MAX_BATCH = 2**30
"""Samples in a micro-batch or an optimizer step."""
MAX_STEPS = 100_000_000
"""Most measured (and most warmup) steps a run takes: step numbers are int32 in
``steps.parquet``, and a measured phase may grow to 20 x its steps (kit.measure_window)."""
MAX_LAYERS = 2**16
MAX_WIDTH = 2**24
"""Hidden, MLP and sequence lengths, vocabulary, attention heads, experts."""
MAX_GIB = 2.0**20
"""A memory amount in GiB (a pebibyte)."""
MAX_RATE = 1e9
"""TFLOP/s, GB/s or W of one device or link."""
MAX_SECONDS = 10**7
"""A time limit or sampling period in seconds (about 116 days)."""
MAX_SWEEP_POINTS = 10_000
"""Points a sweep may have (its axes' alternatives multiplied), counted before it expands."""
