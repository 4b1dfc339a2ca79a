"""``python -m gpusim``."""

import sys

from gpusim.cli import main

sys.exit(main())
