"""``main(argv)`` for driving training in-process (tests) or as ``python -m train``."""

from .command import main

__all__ = ["main"]
