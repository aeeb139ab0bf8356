"""Projection of step time, MFU, power and energy to another layout or scale from measured
bundles (``charllm-kit project``; docs/projection.md): kit.projection.model runs the model."""
