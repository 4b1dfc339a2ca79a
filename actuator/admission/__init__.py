"""Admission: which GPU tasks run now, and carrying it out.

``policy`` decides (pure: exporter state, trigger, ledger in; a ``Decision`` out), ``history``
and ``slo`` give it what the actuator saw lately (``slo`` also acts on the protect_slo
alerts), ``fastpath`` triggers it from the exporter's events and ``targets`` from admission
alerts, ``executor`` carries pause/unpause out through ``freezer`` (the cgroup freezer) and
the container engine.
"""
