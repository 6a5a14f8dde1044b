"""Capture sources: PyTorch profiler (Kineto), NVML sampler, host-only events."""
