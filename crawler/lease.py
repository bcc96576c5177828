"""A Redis-shared crawl that survives the death of one of its crawlers, and a Redis that restarts.

scrapy-redis's scheduler pops a request from the shared queue and marks every request it queues
as seen in the shared duplicate filter. A crawler killed with SIGKILL then takes with it the
requests it had popped and the rows it had not committed yet (parts commit every
``LAIT_PART_SECONDS``), and no crawler fetches them again: the filter says they were seen. One
such kill lost 32 of 110 pages and 68 of 441 images (issue 59).

`LeasedScheduler` keeps, for each crawler, the requests it holds in Redis:

- ``KEY:alive:RUN`` is the crawler's lease, a key that expires unless the crawler renews it
  (every third of ``LAIT_REDIS_LEASE_SECONDS``);
- ``KEY:held:RUN`` is a hash of the requests it popped whose rows are not known to be committed
  (a token per pop -> the request as the queue held it: JSON, never pickle). Taking a request
  from the queue and holding it is one step in Redis (a script), and so is marking a request
  seen and queueing it: a death between two commands loses nothing.

A request leaves the hash when its rows are surely committed: one full commit cycle after its
callback ran (`PartsPipeline` reports every full commit), or when the crawler is idle and has
committed everything; or when it goes back to the queue (a redirect, a retry, a stop). Any
crawler that finds a hash whose lease has expired takes it over (one atomic RENAME, so only one
does) and puts back in the queue each of its requests whose URL is not in the committed output,
past the duplicate filter: every page and image is then written once. A crawler with an empty
queue does not stop while another crawler holds requests: they may still bring new links, or
come back to the queue when their holder dies.

A lost connection to Redis is one warning line, then quiet retries: a request that could not be
queued waits in memory and is queued when Redis answers again, and the line that says it is
back gives how long it was away. Scrapy's own loop would log a traceback at every attempt.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scrapy_redis.scheduler import Scheduler

log = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 30.0

# Each runs in Redis as one step, so that a crawler killed (or a connection lost) between its
# commands cannot lose a request: marked seen but never queued, or taken from the queue but
# held by nobody. scrapy-redis sends them one by one. The queue is scrapy-redis's priority
# queue: a sorted set scored by minus the priority.
QUEUE_SCRIPT = """
if ARGV[1] == '1' or redis.call('SADD', KEYS[1], ARGV[2]) == 1 then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
  return 1
end
return 0
"""
POP_SCRIPT = """
local first = redis.call('ZRANGE', KEYS[1], 0, 0)
if #first == 0 then return false end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, 0)
redis.call('HSET', KEYS[2], ARGV[1], first[1])
return first[1]
"""
TOKEN = "lait_lease"  # request meta: the request's field in its holder's hash


def _redis_errors() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.ConnectionError, redis.TimeoutError)


def committed_urls(out: str) -> set[str]:
    """The page and image URLs the committed parts of work directory `out` hold, with the
    requests they record as never sent (`crawl/...` rows): what need not be fetched again."""
    from lait import storage
    from lait.workdir import WorkDir

    work = WorkDir(out)
    done: set[str] = set()
    if storage.is_dir(work.table_dir("pages")):
        done.update(r["url"] for r in work.iter_rows("pages", columns=["url"]))
    if storage.is_dir(work.table_dir("images")):
        done.update(r["image_url"] for r in work.iter_rows("images", columns=["image_url"]))
    if storage.is_dir(work.table_dir("rejected")):
        for r in work.iter_rows("rejected", columns=["reason", "page_url", "image_url"]):
            if r["reason"].startswith("crawl/") and r["reason"] != "crawl/too_deep":
                done.add(r["image_url"] or r["page_url"])
    return done


class LeasedScheduler(Scheduler):
    """scrapy-redis's scheduler with leases on the requests a crawler holds, and quiet retries
    while Redis is unreachable (see the module docstring)."""

    def __init__(self, *args: Any, lease_seconds: float = DEFAULT_LEASE_SECONDS, key: str = "lait",
                 out: str = "", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lease_seconds = lease_seconds
        self.key = key
        self.out = out
        self.run_id = ""
        self.waiting: list[Any] = []  # requests Redis could not take yet
        self.down_since: float | None = None
        self._finished: list[str] = []  # callbacks done, rows perhaps in open parts
        self._committed_once: list[str] = []  # callbacks done before the latest full commit
        self._beat = None
        self._last_claim = 0.0
        self._seq = 0
        self.crawl_stats = None
        self._issued: set[str] = set()  # tokens handed to Scrapy and not released yet
        self._releasing: list[str] = []  # held requests queued again: released once pushed
        self.commit_parts = None  # the pipeline's `commit_all`, which it sets

    @classmethod
    def from_crawler(cls, crawler):
        instance = super().from_crawler(crawler)
        # scrapy-redis counts with the `spider` argument Scrapy 2.13 deprecates: a warning in
        # every crawler's log. The counts are kept here instead, under the same names.
        instance.crawl_stats, instance.stats = instance.stats, None
        return instance

    @classmethod
    def from_settings(cls, settings):
        instance = super().from_settings(settings)
        instance.lease_seconds = settings.getfloat("LAIT_REDIS_LEASE_SECONDS", DEFAULT_LEASE_SECONDS)
        instance.key = settings.get("LAIT_REDIS_KEY", "lait")
        instance.out = settings.get("LAIT_OUT", "")
        return instance

    # -- keys ----------------------------------------------------------------------------------
    def _alive(self, run_id: str) -> str:
        return f"{self.key}:alive:{run_id}"

    def _held(self, run_id: str) -> str:
        return f"{self.key}:held:{run_id}"

    # -- Redis away and back -------------------------------------------------------------------
    def _lost(self, exc: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning("Redis is unreachable (%s: %s); retrying, the crawl goes on when it answers",
                        type(exc).__name__, exc)
        if self.crawl_stats is not None:
            self.crawl_stats.inc_value("crawl/redis_errors")

    def _back(self) -> bool:
        """Redis answered: True when it had been away."""
        if self.down_since is None:
            return False
        log.warning("Redis answers again after %.1f s", time.monotonic() - self.down_since)
        self.down_since = None
        return True

    def _return_unissued(self) -> None:
        """Put back into the queue what this crawler holds but never handed to Scrapy: a pop whose
        answer the lost connection swallowed (it ran in Redis, the reply never came)."""
        held = self.server.hgetall(self._held(self.run_id))
        for field, data in held.items():
            if field.decode() not in self._issued:
                self.queue.push(self.queue._decode_request(data).replace(dont_filter=True))
                self.server.hdel(self._held(self.run_id), field)

    # -- Scrapy's scheduler interface ----------------------------------------------------------
    def open(self, spider):
        super().open(spider)
        from scrapy_redis.queue import PriorityQueue

        if not isinstance(self.queue, PriorityQueue):
            raise ValueError(f"{type(self).__name__} needs scrapy-redis's PriorityQueue, not {type(self.queue).__name__}")
        self._queue_script = self.server.register_script(QUEUE_SCRIPT)
        self._pop_script = self.server.register_script(POP_SCRIPT)
        self.run_id = getattr(spider, "run_id", "") or f"{id(self):x}"
        spider.lease = self  # the spider reports finished callbacks, the pipeline full commits
        try:
            self._renew()
            self._claim()
        except _redis_errors() as exc:
            self._lost(exc)
        from twisted.internet import task

        self._beat = task.LoopingCall(self._tick)
        self._beat.start(max(0.2, self.lease_seconds / 3), now=False)

    def close(self, reason):
        if self._beat is not None and self._beat.running:
            self._beat.stop()
        try:
            if reason != "disk_full":  # rows were lost: what it held stays for another crawler
                self._push_waiting()
                self._return_unissued()
                self.server.delete(self._held(self.run_id))
            self.server.delete(self._alive(self.run_id))
        except _redis_errors() as exc:
            log.warning("Redis is unreachable at the end of the crawl (%s); the requests this crawler held "
                        "are taken over by the next crawler once its lease expires", exc)
        return super().close(reason)

    def enqueue_request(self, request):
        # A request this crawler held that comes back (a redirect, a retry, a stop's cancelled
        # download) is the queue's again once pushed: its hold ends there.
        token = request.meta.pop(TOKEN, None)
        if token is not None:
            self._releasing.append(token)
        if self.waiting or self.down_since is not None:
            self.waiting.append(request)
            return True
        try:
            queued = self._queue(request)
            self._release_requeued()
            if queued and self.crawl_stats is not None:
                self.crawl_stats.inc_value("scheduler/enqueued/redis")
        except _redis_errors() as exc:
            self._lost(exc)
            self.waiting.append(request)
            return True
        return queued

    def _queue(self, request) -> bool:
        """Mark `request` seen and queue it, in one step; False when it was seen before."""
        fp = self.df.request_fingerprint(request)
        # Most requests are links seen before: asked first, so that only a new one is encoded
        # (0.6 ms of JSON a request; the script asks again, in the same step as it queues).
        if not request.dont_filter and self.server.sismember(self.df.key, fp):
            self.df.log(request, self.spider)
            return False
        queued = self._queue_script(keys=[self.df.key, self.queue.key],
                                    args=["1" if request.dont_filter else "0", fp, -request.priority,
                                          self.queue._encode_request(request)])
        if not queued:
            self.df.log(request, self.spider)
        return bool(queued)

    def _release_requeued(self) -> None:
        if self._releasing:
            self.server.hdel(self._held(self.run_id), *self._releasing)
            self._issued.difference_update(self._releasing)
            self._releasing = []

    def next_request(self):
        if self.down_since is not None:
            return None  # the heartbeat finds out when Redis is back
        self._seq += 1
        token = str(self._seq)  # not the fingerprint: a request may be held twice (replays)
        try:
            data = self._pop_script(keys=[self.queue.key, self._held(self.run_id)], args=[token])
        except _redis_errors() as exc:
            self._lost(exc)
            return None
        if data is None:
            return None
        request = self.queue._decode_request(data)
        request.meta[TOKEN] = token
        self._issued.add(token)
        if self.crawl_stats is not None:
            self.crawl_stats.inc_value("scheduler/dequeued/redis")
        return request

    def has_pending_requests(self):
        if self.waiting or self.down_since is not None:
            return True
        try:
            return super().has_pending_requests()
        except _redis_errors() as exc:
            self._lost(exc)
            return True

    # -- what the spider and the pipeline report -----------------------------------------------
    def finished(self, request) -> None:
        """The callback (or errback) of `request` has run: its rows are written, perhaps into
        parts still open."""
        token = request.meta.get(TOKEN)
        if token is not None:
            self._finished.append(token)

    def committed(self) -> None:
        """Every open part was committed. The requests finished before the previous full commit
        are released now: one whole commit cycle later, so that rows still on their way through
        Scrapy's item processing when a callback ended have long been written."""
        release, self._committed_once, self._finished = self._committed_once, self._finished, []
        if release:
            try:
                self.server.hdel(self._held(self.run_id), *release)
                self._issued.difference_update(release)
            except _redis_errors() as exc:
                self._lost(exc)
                self._committed_once = release + self._committed_once

    def idle(self) -> None:
        """Nothing is downloading or being processed: commit the parts and let every finished
        request go, so that the others see this crawler holds nothing."""
        try:
            if self.commit_parts is None or not self.commit_parts():
                return
            release, self._finished, self._committed_once = self._committed_once + self._finished, [], []
            if release:
                self.server.hdel(self._held(self.run_id), *release)
                self._issued.difference_update(release)
        except _redis_errors() as exc:
            self._lost(exc)

    def others_hold_requests(self) -> bool:
        """Whether another crawler of this crawl holds requests (or a dead one's wait to be
        taken over): the crawl is not over, whatever the queue says."""
        try:
            prefix = len(self._held(""))
            return any(k.decode()[prefix:].split("~", 1)[0] != self.run_id
                       for k in self.server.scan_iter(match=self._held("*"), count=1000))
        except _redis_errors() as exc:
            self._lost(exc)
            return True

    # -- lease and takeover --------------------------------------------------------------------
    def _tick(self) -> None:
        try:
            self._renew()
            if self._back():
                self._return_unissued()
            self._push_waiting()
            self._release_requeued()
            if time.monotonic() - self._last_claim >= self.lease_seconds / 3:
                self._claim()
        except _redis_errors() as exc:
            self._lost(exc)
        except Exception:  # a LoopingCall that raises stops for good: the lease would expire
            log.exception("renewing this crawler's lease failed")

    def _renew(self) -> None:
        self.server.set(self._alive(self.run_id), b"1", px=int(self.lease_seconds * 1000))

    def _push_waiting(self) -> None:
        while self.waiting:
            self._queue(self.waiting[0])
            self.waiting.pop(0)

    def _claim(self) -> int:
        """Take over the held requests of every crawler whose lease has expired; returns how
        many went back into the queue. A hash being taken over is renamed `KEY:held:ME~OWNER`:
        held under this crawler's lease, so that if it dies on the way another takes it over."""
        import redis

        self._last_claim = time.monotonic()
        prefix = self._held("")
        back = 0
        for key in list(self.server.scan_iter(match=self._held("*"), count=1000)):
            owner = key.decode()[len(prefix):]
            holder = owner.split("~", 1)[0]
            if holder == self.run_id or self.server.exists(self._alive(holder)):
                continue
            mine = self._held(f"{self.run_id}~{owner}")
            try:
                self.server.rename(key, mine)  # atomic: one crawler takes it
            except redis.ResponseError:
                continue  # another crawler took it first
            back += self._requeue(owner, mine)
        return back

    def _requeue(self, owner: str, key: str) -> int:
        held = self.server.hgetall(key)
        done = committed_urls(self.out) if held and self.out else set()
        back = 0
        for field, data in held.items():
            request = self.queue._decode_request(data)
            if request.url not in done:
                request.meta.pop(TOKEN, None)
                self.queue.push(request.replace(dont_filter=True))  # the filter saw it: past it
                back += 1
            self.server.hdel(key, field)  # pushed: a death from here on fetches it twice, never not
        self.server.delete(key)
        log.warning("crawler %s stopped holding %d requests (its lease expired): %d not in the committed "
                    "output went back into the queue", owner.split("~")[-1], len(held), back)
        if self.crawl_stats is not None:
            self.crawl_stats.inc_value("crawl/requests_taken_over", back)
        return back
