"""Code the tests and the benchmarks share that the runtime never needs (reference
implementations, load generators); never imported by ``gpuguard``."""
