"""GPU workloads that log their own timestamps: the ground truth gpuguard is measured against.

``python -m gpuguard.gpusim.workload [KIND] ...`` with KIND one of ``oneshot`` (default:
paper B's matmul task), ``server`` (an inference server answering requests) and ``train``
(a training loop). Each runs on gpusim (``--backend sim``) or on a real GPU through CUDA
(``--backend cuda``: torch, else cupy), on one device or several (``--devices 0,1``), and
writes JSON lines (docs/interfaces.md section 1). Exit status: 0 done, 1 daemon or GPU
failure, 2 bad arguments, 3 out of memory.
"""

from gpuguard.gpusim.workload.cli import main
from gpuguard.gpusim.workload.events import EXIT_FAILED, EXIT_OUT_OF_MEMORY, EventLog

__all__ = ["EXIT_FAILED", "EXIT_OUT_OF_MEMORY", "EventLog", "main"]
