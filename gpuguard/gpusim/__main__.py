"""``python -m gpuguard.gpusim``."""

import sys

from gpuguard.gpusim.cli import main

sys.exit(main())
