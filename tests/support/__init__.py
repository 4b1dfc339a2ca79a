"""Code only the tests need (certificates, a Kubernetes API stand-in, script loaders, readers
of what gpuguard writes); never imported by ``gpuguard``, ``bench/`` or ``deploy/``
(tests/unit/test_architecture.py). What the benchmarks share with the tests lives in the
harness, ``gpuguard/demo/stack/``."""
