"""Engine-neutral fast kernels (compiled element-wise functions, the fused cross-entropy) that
both training engines put in place of their slower stock paths."""
