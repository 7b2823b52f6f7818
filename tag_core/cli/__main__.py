"""`python -m tag_core.cli` is `tag`."""

import sys

from tag_core.cli import main

sys.exit(main())
