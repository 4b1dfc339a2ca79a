"""``gpuguard guard``, its own program: resumes what the actuator paused when the actuator
cannot (``program``), and its own ``/metrics`` (``metrics``)."""
