"""The launch probe: eBPF uprobes on the CUDA driver API (C sources here, built on demand)."""
