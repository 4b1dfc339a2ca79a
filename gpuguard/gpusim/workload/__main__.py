"""``python -m gpuguard.gpusim.workload``."""

import sys

from gpuguard.gpusim.workload.cli import main

sys.exit(main())
