"""gpuguard's placer: paper C's node list across a cluster.

Every node's exporter publishes its node record (``gpuguard/exporter/record.py``; the types are
``gpuguard/noderecord.py``); Prometheus scrapes them all; the placer reads the records from
Prometheus (``source``), ranks nodes and GPUs for a new real-time container (``ranking``,
pure, no Swarm), remembers what it placed until the records show it (``reservations``) and
answers over HTTP (``service``, ``http``). ``gpuguard run --placer.url``
(``gpuguard/commands/placed_run.py``) turns an answer into a Swarm service pinned to the
chosen node. The placer imports neither the exporter nor the simulator.
"""
