"""GPU backends: NVML (real GPUs) and gpusim (the simulated GPU), behind one interface."""
