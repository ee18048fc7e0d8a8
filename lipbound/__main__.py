"""``python -m lipbound``: the same as the ``lipbound`` command."""

import sys

from .cli import main

if __name__ == "__main__":  # worker processes (``--jobs``) import this module without running it
    sys.exit(main())
