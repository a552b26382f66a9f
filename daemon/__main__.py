"""`python -m daemon`: the same as the `evald` command."""

import sys

from daemon.cli import main

sys.exit(main())
