"""Admission: which GPU tasks run now. Decides only (pure but for the history it keeps).

``policy`` decides (exporter state, trigger, ledger in; a ``Decision`` out); ``history``,
``ratecontrol``, ``pressure`` and ``slosignal`` give it what the actuator saw lately.
"""
