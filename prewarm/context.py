"""What a process needs to act on the fleet: settings, Redis, Celery, the catalog and the dispatcher.

Built once per process; the catalog is loaded lazily and reloaded when its file changes (its mtime is
looked at no more than once every CATALOG_RECHECK_S: the hooks read the catalog on every request, and two
stat calls per request were a measurable share of a one-event hook on a busy machine). One thread reloads at
a time; meanwhile the others are served the catalog they had, without waiting (a web worker's request
threads each starting their own reload of a slow catalog piled up gigabytes and hung requests).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from functools import cached_property

import redis
from celery import Celery

from prewarm import runtime
from prewarm.catalog import load_catalog
from prewarm.catalog_entries import Catalog
from prewarm.celery_app import make_celery
from prewarm.config import Settings
from prewarm.dispatch import Dispatcher

log = logging.getLogger(__name__)
CATALOG_RECHECK_S = 1.0


class Context:
    def __init__(self, settings: Settings | None = None, *, start_redis: bool = True) -> None:
        self.settings = settings or Settings.from_env()
        self.redis_url = runtime.redis_url(self.settings, start=start_redis)
        self._catalog: Catalog | None = None
        self._catalog_mtime = 0.0
        self._catalog_checked = -CATALOG_RECHECK_S  # time.monotonic() of the last mtime check
        self._catalog_reload = threading.Lock()  # held by the one thread checking or reloading the catalog
        # web.throttle: the clients this process saw throttled, with their window (the hook paths look
        # only these up in Redis before letting a right token through)
        self.throttled_clients: dict[str, int] = {}

    @cached_property
    def r(self) -> redis.Redis:
        return runtime.connect(self.redis_url, wait_replicas=self.settings.redis_wait_replicas)

    @cached_property
    def celery(self) -> Celery:
        return make_celery(self.redis_url)

    @cached_property
    def dispatcher(self) -> Dispatcher:
        return Dispatcher(self.r, self.celery, intent_ttl=self.settings.intent_ttl,
                          event_log_max=self.settings.event_log_max)

    @property
    def catalog(self) -> Catalog:
        current = self._catalog
        if current is not None and time.monotonic() - self._catalog_checked < CATALOG_RECHECK_S:
            return current
        # With a catalog to serve, a thread finding a reload under way serves that one rather than wait;
        # only the very first load is waited for (there is nothing else to serve).
        if current is None:
            self._catalog_reload.acquire()
        elif not self._catalog_reload.acquire(blocking=False):
            return current
        try:
            return self._reload_if_changed()
        finally:
            self._catalog_reload.release()

    def _reload_if_changed(self) -> Catalog:
        """The catalog, reloaded if its file changed; called holding _catalog_reload."""
        now = time.monotonic()
        if self._catalog is not None and now - self._catalog_checked < CATALOG_RECHECK_S:
            return self._catalog  # another thread checked while this one waited for the first load
        self._catalog_checked = now
        path = self.settings.catalog
        mtime = os.stat(path).st_mtime if path.exists() else 0.0
        if self._catalog is None or mtime != self._catalog_mtime:
            # Lenient: a broken entry is left out (and logged) rather than taking every model down.
            catalog = load_catalog(path, strict=False)
            self._catalog, self._catalog_mtime = catalog, mtime  # swapped whole: readers see old or new
            for name, problem in catalog.problems.items():
                log.error("catalog %s: model %s left out: %s", path, name, problem)
        return self._catalog
