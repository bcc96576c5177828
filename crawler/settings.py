"""Scrapy settings of the `lait` crawler: polite and safe by default.

`scrapy crawl lait ...` from the repository root reads this module (scrapy.cfg); `lait crawl`
uses it too. The spider lays the values of its `CrawlConfig` over these at "spider" priority
(see `lait.crawler.run.scrapy_settings`), and `-s NAME=VALUE` on the command line still wins.
"""

from scrapy.settings import default_settings as _scrapy_defaults

from lait import SITE_OWNERS_URL, __version__

BOT_NAME = "lait"
SPIDER_MODULES = ["lait.crawler.spiders"]
NEWSPIDER_MODULE = "lait.crawler.spiders"

# An identifying user agent with a contact page: what lait fetches, how to opt out, the token.
USER_AGENT = f"lait/{__version__} (image-text dataset crawler; +{SITE_OWNERS_URL})"

# Politeness: robots.txt for every host (lait.crawler.robots, RFC 9309), lait's own group first.
ROBOTSTXT_OBEY = True
ROBOTSTXT_USER_AGENT = "lait"
LAIT_TDMREP_OBEY = True
LAIT_ORIGIN_RETRY_SECONDS = 600.0  # an unreachable robots.txt / tdmrep.json is asked again after this
AUTOTHROTTLE_ENABLED = True
AUTOTHROTTLE_START_DELAY = 1.0
AUTOTHROTTLE_MAX_DELAY = 30.0
AUTOTHROTTLE_TARGET_CONCURRENCY = 4.0
CONCURRENT_REQUESTS = 32
CONCURRENT_REQUESTS_PER_DOMAIN = 8
DOWNLOAD_DELAY = 0.0
COOKIES_ENABLED = False

# Broad crawl (docs/crawling.md): every host holds at most its per-domain share of the
# downloader, counted from the first middleware on; a host failing LAIT_HOST_DOWN_AFTER times in
# a row is marked down; DNS answers (failures too) are cached, in more reactor threads.
DOWNLOADER = "lait.crawler.hosts.HostAwareDownloader"
SCHEDULER_PRIORITY_QUEUE = "lait.crawler.hosts.HostFairQueue"
LAIT_HOST_DOWN_AFTER = 3
REACTOR_THREADPOOL_MAXSIZE = 20
LAIT_RESOLVE: list[str] = []  # HOST:PORT:ADDRESS overrides (lait crawl --resolve)

# Limits: time, size, retries. Images get their own size limit (request meta).
DOWNLOAD_TIMEOUT = 30
DOWNLOAD_MAXSIZE = 10 * 1024 * 1024
DOWNLOAD_WARNSIZE = 0
LAIT_IMAGE_MAXSIZE = 20 * 1024 * 1024
# A compressed body inflates to at most its request's size limit; where that is 0, to this.
LAIT_INFLATE_MAXSIZE = 64 * 1024 * 1024
RETRY_ENABLED = True
RETRY_TIMES = 2
REDIRECT_MAX_TIMES = 5
DNS_TIMEOUT = 10

# Every status reaches the spider, which records it (404s are rows with status 404).
HTTPERROR_ALLOW_ALL = True

# SSRF guard: refuse private, loopback, link-local and metadata addresses after DNS resolution.
LAIT_ALLOW_LOOPBACK = False
LAIT_ALLOW_PRIVATE = False
LAIT_ALLOW_METADATA = False
TWISTED_DNS_RESOLVER = "lait.crawler.middlewares.GuardedResolver"
LAIT_EXCLUDE_DOMAINS = ""  # UT1-format block lists (lait.crawler.exclusions); "" for none
LAIT_EXCLUDE_URLS = ""
DOWNLOADER_MIDDLEWARES = {
    # Scrapy's offsite filter drops a request at scheduling without a word: lait's filters at the
    # download, where a refusal becomes a crawl/ignored row (lait.crawler.redirects).
    "scrapy.downloadermiddlewares.offsite.OffsiteMiddleware": None,
    "lait.crawler.redirects.OffsiteMiddleware": 50,
    # A listed domain or URL is refused first: not its address, not its robots.txt is asked for.
    "lait.crawler.exclusions.ExcludeListMiddleware": 51,
    # After the offsite filter (50): a host marked down, then refused addresses, see nothing.
    "lait.crawler.hosts.HostDownMiddleware": 55,
    "lait.crawler.middlewares.AddressGuardMiddleware": 60,
    # Scrapy's robots.txt middleware lets the offsite filter drop robots.txt of image hosts and
    # allows everything when robots.txt fails: lait's reads it for every host (RFC 9309).
    "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
    "lait.crawler.robots.RobotsTxtMiddleware": 100,
    "lait.crawler.tdmrep.TdmRepMiddleware": 110,
    # Responses pass it before Scrapy's HttpCompressionMiddleware (590) decodes them: it bounds
    # every decompression (robots.txt and tdmrep.json included) by decompressed bytes.
    "lait.crawler.origindocs.InflateLimitMiddleware": 595,
    # Responses pass it before Scrapy's RedirectMiddleware (600): a loop becomes a row.
    "lait.crawler.redirects.RedirectLoopMiddleware": 610,
}

ITEM_PIPELINES = {
    "lait.crawler.pipelines.PartsPipeline": 300,
}

# Breadth-first, so max_pages takes the pages nearest to the seeds.
DEPTH_PRIORITY = 1
SCHEDULER_MEMORY_QUEUE = "scrapy.squeues.FifoMemoryQueue"
# With JOBDIR, queued requests are stored with marshal, never pickle.
SCHEDULER_DISK_QUEUE = "scrapy.squeues.MarshalFifoDiskQueue"
SCHEDULER_START_DISK_QUEUE = "scrapy.squeues.MarshalFifoDiskQueue"

# Output (the spider sets these from its arguments).
LAIT_OUT = ""
LAIT_PARTITIONS = None
LAIT_PART_ROWS = 2000
LAIT_PART_BYTES = 128 * 1024 * 1024
LAIT_PART_SECONDS = 60.0
LAIT_PART_BUFFER_BYTES = 32 * 1024 * 1024  # rows waiting in all open parts together

LOG_LEVEL = "INFO"
# Scrapy checks every generator callback for `return value` by parsing its source, and its
# cache holds the bound method weakly, so the check reruns on every response (~1 ms each, a
# tenth of an image download's CPU). lait's callbacks are fixed: no check.
WARN_ON_GENERATOR_RETURN_VALUE = False
TELNETCONSOLE_ENABLED = False
# Scrapy 2.19's remote control serves an HTTP endpoint that runs Python code, and leaves a job
# file with its port and token in ~/.local/state/scrapy/job_files (for good when the crawl is
# killed): a crawler of untrusted pages needs neither.
REMOTE_CONTROL_ENABLED = False
# Off, and not even imported: its module imports aiohttp, a third of a second of every crawler
# process's start-up, only for Scrapy to find it not configured. It is left out of the base list:
# naming it in EXTENSIONS (even as None) has Scrapy import it to normalise the name.
EXTENSIONS_BASE = {name: order for name, order in _scrapy_defaults.EXTENSIONS_BASE.items()
                   if not name.endswith(".RemoteControl")}
REQUEST_FINGERPRINTER_IMPLEMENTATION = "2.7"
# A page request and an image request of one URL are two requests (lait.crawler.fingerprints).
REQUEST_FINGERPRINTER_CLASS = "lait.crawler.fingerprints.KindFingerprinter"
FEED_EXPORT_ENCODING = "utf-8"
