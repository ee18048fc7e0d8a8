"""``python -m lipbound.cli``: the same as the ``lipbound`` command."""

import sys

from . import main

sys.exit(main())
