"""``lait serve-site``: serve the built-in local web (synthetic or real-web) on loopback."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

DESCRIPTION = """\
Serve the built-in local web that `lait demo`, the tests and the crawler use.

By default this is a deterministic synthetic news site of --pages articles: photo-like
images with true captions placed in alt, title, figcaption, nearby sentences or og tags,
plus the awkward cases of real pages (junk alt texts, srcset, lazy data-src, <picture>,
icons, a tracking pixel, a wide banner, exact and near duplicates, 404s, German and French
pages, robots.txt-disallowed /private/ pages and X-Robots-Tag: noai). With --real-web it
serves the real pages of ../shared/data/html instead, their images rewritten to local
photos and with planted COCO photo-caption figures. --ground-truth writes what a correct
pipeline should keep or reject, and why.
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``serve-site`` sub-command to a ``lait`` sub-parser set."""
    p = subparsers.add_parser(
        "serve-site", help="serve the built-in local web on 127.0.0.1",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=main)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``serve-site`` (shared by ``lait`` and ``python -m``)."""
    p.add_argument("--pages", type=int, default=200, metavar="N",
                   help="number of articles of the synthetic site (default: 200)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the synthetic site; same seed, same site (default: 0)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000,
                   help="port to listen on; 0 picks a free one (default: 8000)")
    p.add_argument("--real-web", action="store_true",
                   help="serve the real pages of ../shared/data instead of the synthetic site")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="real-web data folder (default: ../shared/data next to the repo)")
    p.add_argument("--ground-truth", type=Path, default=None, metavar="PATH",
                   help="write the site's ground-truth JSON to PATH before serving")
    # Its own dest: `lait -v` already owns `verbose` (a count) on the top-level parser.
    p.add_argument("--verbose", dest="log_requests", action="store_true",
                   help="log every request")


def main(args: argparse.Namespace) -> int:
    """Build the site, print its URL (flushed, first line of stdout) and serve until Ctrl-C."""
    from crawler.site.server import SiteServer

    logging.basicConfig(level=logging.INFO if args.log_requests else logging.WARNING)
    if args.log_requests:
        logging.getLogger("crawler.site").setLevel(logging.INFO)
    if args.real_web:
        from crawler.site.realweb import RealWebSite

        try:
            site = RealWebSite(args.data_dir)
        except FileNotFoundError as exc:
            print(f"lait serve-site: {exc}", file=sys.stderr)
            return 2
    else:
        from crawler.site.generator import generate_site

        site = generate_site(args.pages, args.seed)
    if args.ground_truth is not None:
        site.write_ground_truth(args.ground_truth)
    server = SiteServer(site, args.host, args.port, verbose=args.log_requests)
    print(server.url, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m crawler.site.command",
                                     description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
