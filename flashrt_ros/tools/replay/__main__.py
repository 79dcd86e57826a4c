"""`python -m` on this package: the same as `flashrt-replay`."""
import sys

from .cli import main

sys.exit(main())
