import sys

from lait.cli import main

sys.exit(main())
