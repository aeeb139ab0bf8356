"""What a run computes as it ends, from its step records, telemetry rows and profiles.

Model FLOPs and MFU (``flops``), the summary of ``metrics.json`` (``summary``), energy and
power windows (``energy``, ``power``, over the step windows of ``attribution``), stragglers,
expert load, kernel breakdowns of profiled steps (``kernels``, ``moe_breakdown``) and the names
of configurations and devices (``labels``). The launcher's assembly, the engines, the sampler
and the readers above (compare, report, projection) use them; they read only the bundle's
format and the run's config.
"""
