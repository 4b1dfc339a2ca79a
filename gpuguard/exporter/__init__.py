"""gpuguard's exporter: which container runs which GPU task, and how it stands to its deadline.

The pipeline reads in one direction (docs/interfaces.md):
``backends`` (GPU sample) + ``containers`` (Docker index) + ``cgroup`` (pid -> container)
-> ``join`` (pure) -> ``tracker`` (task life cycle) -> ``collector`` / ``http``.
"""
