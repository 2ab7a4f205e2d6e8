"""`python -m whitney.local serve ...`: the embedded Whitney server on its own."""

from __future__ import annotations

import sys

from whitney.local.cli import main

if __name__ == "__main__":
    sys.exit(main())
