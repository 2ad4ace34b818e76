"""Devices: how much memory there is, how much is ours, a job's peak (CUDA with NVML, the
CPU, simulated), and the executor that runs device work and measures it."""
