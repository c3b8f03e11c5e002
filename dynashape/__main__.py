"""python -m dynashape: the dynashape command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
