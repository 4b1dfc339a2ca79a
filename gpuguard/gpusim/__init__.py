"""gpusim: a simulated GPU that real processes in real containers can use.

A daemon owns simulated GPUs and MIG instances and speaks newline-delimited JSON over a
Unix socket (docs/interfaces.md section 1). Each context has a CUDA-like stream (asynchronous
launches into a bounded queue, synchronous copies); kernels of different processes
time-slice with the context-switch overhead of a device profile (paper B's by default);
copies share bandwidth; the daemon reports what NVML reports. ``gpusim.workload`` holds the
workloads (oneshot, server, train) that drive it, or a real GPU.
"""

DEFAULT_SOCKET = "/run/gpusim/gpusim.sock"
SOCKET_ENV = "GPUSIM_SOCKET"
