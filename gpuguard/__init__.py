"""gpuguard: deadline-aware monitoring and admission control for shared GPUs."""

__version__ = "0.1.0"
