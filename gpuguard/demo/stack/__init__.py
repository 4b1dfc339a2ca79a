"""The local loopback stack: private dockerd, gpusim, Prometheus, Alertmanager, gpuguard.

Used by the demo (``make demo``), the integration tests and the benchmarks, so that all
three start and stop real services the same way: each process is started with its own
pidfile and stopped by its PID.
"""
