"""`python -m statecache` runs the CLI (the same as the `statecache` script)."""

import sys

from statecache.cli import main

sys.exit(main())
