"""The contention curve: how much slower each of n kernels runs when they share one GPU.

Kernels of several processes time-slice the device, and each switch costs: paper B measured
the kernel time of n = 1..10 concurrent 13,312 x 13,312 matmuls on one GPU. The simulated
GPU runs its kernels by this curve (``gpuguard/gpusim/contention.py``) and the placer predicts a
newcomer's run time with it (``gpuguard/placer/ranking.py``), so it lives here, below both. Pure.
"""

from __future__ import annotations

#: Paper B, kernel time (s) of each of n concurrent 13,312 x 13,312 matmuls, n = 1..10.
PAPER_B_KERNEL_S: tuple[float, ...] = (
    10.795, 23.271, 34.782, 46.419, 58.019, 69.374, 81.166, 92.698, 104.007, 115.484,
)  # fmt: skip
PAPER_B_SIZE = 13312


def slowdown_factor(n: int, kernel_s: tuple[float, ...] = PAPER_B_KERNEL_S) -> float:
    """Context-switch overhead of ``n`` time-sliced kernels: ``T_n / (n * T_1)``.

    ``kernel_s`` is a measured curve (``T_n`` for n = 1, 2, ...); beyond it the overhead of
    the largest measured n is held.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    n = min(n, len(kernel_s))
    return kernel_s[n - 1] / (n * kernel_s[0])
