"""`python -m lait`: the `lait` command."""

import sys

from lait.app.cli import main

sys.exit(main())
