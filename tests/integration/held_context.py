"""A long-lived GPU process for the integration tests: one gpusim context (and cached memory)
held for its whole life, requests (kernels) with idle gaps between them, each logged with its
own wall-clock timestamps, then idle until it exits. What an inference server or a notebook
looks like to NVML; gpusim's own workload destroys its context after every task.

``python -m tests.integration.held_context --socket S --log L --requests 3 --work 6 --gap 1.5``
"""

from __future__ import annotations

import argparse
import json
import time
from typing import IO, Any

from gpuguard.gpusim.client import GpusimClient


def _log(out: IO[str], event: str, **fields: Any) -> None:
    out.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
    out.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--work", type=float, default=6.0, help="device-seconds per request")
    parser.add_argument("--gap", type=float, default=1.5, help="idle seconds before each")
    parser.add_argument("--cached-bytes", type=int, default=256 * 2**20, help="kept all along")
    parser.add_argument("--idle-after", type=float, default=0.0, help="idle seconds at the end")
    args = parser.parse_args()
    with GpusimClient(args.socket) as gpu, open(args.log, "a") as out:
        gpu.context_create(0)
        gpu.alloc(args.cached_bytes)  # weights and the caching allocator's pool
        _log(out, "ready")
        for request in range(args.requests):
            time.sleep(args.gap)
            _log(out, "request_start", request=request)
            started, ended = gpu.kernel(args.work)
            _log(out, "request_end", request=request, kernel_started=started, kernel_ended=ended)
        time.sleep(args.idle_after)
        _log(out, "exit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
