"""The harness: the demo (``main``, ``scenes``, ``timeline``) and the local loopback stack
(``stack``) that the demo, the integration tests and the benchmarks start and stop.

Never imported by the runtime: ``gpuguard demo`` (``gpuguard/commands/demo.py``) loads it
when it runs, and ``tests/unit/test_package.py`` checks that the services never do.
"""
