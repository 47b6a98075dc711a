"""Leader election: exactly one scheduler plans at a time.

A redis-py `Lock` with a TTL. The leader extends it every tick; a standby tries to take it every tick and
succeeds once the leader has stopped extending it (crashed, hung, partitioned) and the TTL ran out. If
Redis loses its data, the lock vanishes with it and whoever asks first becomes leader again.

Fenced across a Sentinel failover: the promoted replica may not have the lock (replication is asynchronous).
The leader's extension then finds it gone and at once takes it again with SET NX: it stays leader if nobody
else took it meanwhile, and steps down if a standby did. The lock is one key set only with NX, so at any
time exactly one scheduler holds it, and a scheduler plans only in a tick that began by holding it.
"""

from __future__ import annotations

import logging

import redis
from redis.exceptions import LockError

from prewarm import keys

log = logging.getLogger(__name__)


class Leadership:
    def __init__(self, r: redis.Redis, ident: str, ttl: float) -> None:
        self.ident = ident
        self.ttl = ttl
        # thread_local=False: APScheduler may run ticks on different threads of its pool.
        self.lock = r.lock(keys.LEADER_LOCK, timeout=ttl, blocking=False, thread_local=False)
        self.is_leader = False

    def ensure(self) -> bool:
        """Keep or take the leadership; True if this process may plan now."""
        try:
            if self.is_leader:
                try:
                    self.lock.reacquire()
                    return True
                except LockError:
                    # gone (expired, or lost in a failover) or taken: take it again if it is free, else step down
                    if self.lock.acquire(blocking=False, token=self.ident.encode()):
                        log.warning("scheduler %s took the leader lock again (it had vanished: a Redis failover?)",
                                    self.ident)
                        return True
                    raise
            if self.lock.acquire(blocking=False, token=self.ident.encode()):
                if not self.is_leader:
                    log.info("scheduler %s is now the leader", self.ident)
                self.is_leader = True
                return True
        except LockError:
            log.warning("scheduler %s lost the leader lock", self.ident)
        except redis.RedisError as exc:
            log.warning("scheduler %s cannot reach Redis: %s", self.ident, exc)
        self.is_leader = False
        return False

    def release(self) -> None:
        if self.is_leader:
            try:
                self.lock.release()
            except (LockError, redis.RedisError):
                pass
        self.is_leader = False

    def holder(self) -> str | None:
        raw = self.lock.redis.get(keys.LEADER_LOCK)
        return raw.decode() if raw else None
