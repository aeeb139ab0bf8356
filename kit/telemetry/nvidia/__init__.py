"""NVIDIA telemetry: the NVML source (:mod:`.nvml`), its throttle reasons (:mod:`.throttle`)."""
