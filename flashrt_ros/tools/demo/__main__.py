"""`python -m` on this package: the same as `flashrt-demo`."""
import sys

from .cli import main

sys.exit(main())
