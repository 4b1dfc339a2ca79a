"""gpuguard's actuator: admission control (pause/unpause) and the node list.

Alerts and exporter events are triggers; the exporter's fresh ``/api/v1/state`` is the truth
the pure policy (``policy.decide``) works on; the executor carries actions out on Docker,
journalling each one before it is taken so that a crash never leaves tenants frozen.
"""
