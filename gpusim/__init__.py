"""gpusim: a simulated GPU that real processes in real containers can use.

A daemon owns simulated devices and speaks newline-delimited JSON over a Unix socket
(docs/interfaces.md section 1). Kernels time-slice with the context-switch overhead measured
by paper B; copies share bandwidth; the daemon reports what NVML reports.
"""

DEFAULT_SOCKET = "/run/gpusim/gpusim.sock"
SOCKET_ENV = "GPUSIM_SOCKET"
