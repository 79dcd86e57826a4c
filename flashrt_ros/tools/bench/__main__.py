"""`python -m` on this package: the same as `flashrt-bench`."""
import sys

from .cli import main

sys.exit(main())
