"""``lait serve-site``: serve the built-in local web (synthetic or real-web) on loopback."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

from lait.app.commands import add_config_command
from lait.config import Config, ConfigError, setting

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

--hostile puts a share of the image URLs on hosts that behave like the real web's worst, all
on loopback: a name that does not resolve, a port that refuses, a server that accepts and
never answers, one that trickles bytes, one whose robots.txt disallows lait and one whose
tdmrep.json reserves TDM rights. Two of them have names only the crawler's --resolve knows:
the second line printed is the --resolve flags to give `lait crawl`.
"""


@dataclass
class ServeSiteConfig(Config):
    """Settings of `lait serve-site`."""

    pages: int = setting(200, "number of articles of the synthetic site")
    seed: int = setting(0, "seed of the synthetic site; same seed, same site")
    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(8000, "port to listen on; 0 picks a free one")
    real_web: bool = setting(False, "serve the real pages of ../shared/data instead of the synthetic site")
    data_dir: str | None = setting(None, "real-web data folder (default: ../shared/data next to the repo)")
    ground_truth: str | None = setting(None, "write the site's ground-truth JSON to this path before serving",
                                       metavar="PATH")
    log_requests: bool = setting(False, "log every request")
    hostile: bool = setting(False, "put a share of the images on hostile hosts (dead, refusing, "
                            "silent, trickling, robots-disallowed, TDM-reserved)")

    def validate(self) -> None:
        if self.pages < 1 or not 0 <= self.port < 65536:
            raise ConfigError("--pages must be >= 1 and --port in 0..65535")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``serve-site`` sub-command to a ``lait`` sub-parser set."""
    return add_config_command(subparsers, "serve-site", ServeSiteConfig, main,
                              help="serve the built-in local web on 127.0.0.1", description=DESCRIPTION)


def main(args: ServeSiteConfig) -> int:
    """Build the site, print its URL (flushed, first line of stdout) and serve until Ctrl-C."""
    from pathlib import Path

    from lait.testkit.server import SiteServer

    logging.basicConfig(level=logging.INFO if args.log_requests else logging.WARNING)
    if args.log_requests:
        logging.getLogger("lait.testkit").setLevel(logging.INFO)
    if args.real_web:
        from lait.testkit.realweb import RealWebSite

        try:
            site = RealWebSite(Path(args.data_dir) if args.data_dir else None)
        except FileNotFoundError as exc:
            print(f"lait serve-site: {exc}", file=sys.stderr)
            return 2
    else:
        from lait.testkit.generator import generate_site

        site = generate_site(args.pages, args.seed)
    hostile = None
    if args.hostile:
        from lait.testkit.hostile import HostileHosts

        hostile = HostileHosts().start()
        site.attach_hostile(hostile)
    if args.ground_truth is not None:
        site.write_ground_truth(args.ground_truth)
    server = SiteServer(site, args.host, args.port, verbose=args.log_requests)
    print(server.url, flush=True)
    if hostile is not None:
        print(" ".join(f"--resolve {r}" for r in hostile.crawl_resolve()), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if hostile is not None:
            hostile.close()
    return 0


if __name__ == "__main__":
    from lait.app.cli import main as lait_main

    sys.exit(lait_main(["serve-site", *sys.argv[1:]]))
