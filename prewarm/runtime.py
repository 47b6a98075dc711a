"""Connecting a process to its Redis: the configured one, or the embedded one started for this machine.

With PREWARM_REDIS_URL unset, the first process (normally `prewarm up`) starts an embedded Redis and
writes its URL to <data dir>/redis.url; later processes on the same machine find it there.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import redis

from prewarm import replicated, sentinel
from prewarm.config import Settings
from prewarm.config_errors import redacted
from prewarm.redis_server import EmbeddedRedis

_owned: EmbeddedRedis | None = None
_owned_file: Path | None = None
_resolved: str | None = None  # the URL redis_url() last answered: named when that Redis fails us


def _url_file(settings: Settings) -> Path:
    return settings.data_dir / "redis.url"


def _responds(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping())
    except (redis.RedisError, OSError):
        return False


def redis_url(settings: Settings, *, start: bool = True) -> str:
    """The Redis URL this process should use, starting an embedded Redis if none is configured."""
    global _resolved
    _resolved = _redis_url(settings, start=start)
    return _resolved


def _redis_url(settings: Settings, *, start: bool) -> str:
    global _owned, _owned_file
    if settings.redis_url:
        return settings.redis_url
    if _owned is not None:
        return _owned.url
    f = _url_file(settings)
    if f.exists():
        url = f.read_text().strip()
        if _responds(url):
            return url
    if not start:
        raise RuntimeError("no Redis: set PREWARM_REDIS_URL, or run `prewarm up` to start an embedded one")
    _owned = EmbeddedRedis().start()
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(_owned.url)
    _owned_file = f
    os.environ["PREWARM_REDIS_URL"] = _owned.url  # children we spawn share it
    return _owned.url


def stop_owned() -> None:
    global _owned, _owned_file
    if _owned_file is not None:
        _owned_file.unlink(missing_ok=True)
        _owned_file = None
    if _owned is not None:
        _owned.stop()
        _owned = None


def connect(url: str, *, wait_replicas: int = 0) -> redis.Redis:
    """prewarm's own client for `url`: redis://, rediss://, unix://, or sentinel:// / sentinels:// (the master
    the sentinels name, followed across a failover: prewarm.sentinel). `wait_replicas`: replicas that must
    confirm the writes that ask for it (prewarm.replicated, PREWARM_REDIS_WAIT_REPLICAS)."""
    options = {"health_check_interval": 30, "socket_timeout": 10, "socket_connect_timeout": 5}
    if sentinel.is_sentinel(url):
        client = sentinel.client(sentinel.parse(url), **options)
    else:
        client = redis.Redis.from_url(url, **options)
    return replicated.require(client, wait_replicas)


def redis_failure(exc: BaseException) -> str | None:
    """One line an operator can act on when `exc` is Redis failing this process (down, unreachable, the
    password refused), naming the URL without its password; None for any other error."""
    from kombu.exceptions import OperationalError  # Celery's wrapper when the broker cannot be reached

    if not isinstance(exc, redis.RedisError | OperationalError):
        return None
    url = _resolved or "(PREWARM_REDIS_URL)"
    detail = str(exc) or type(exc).__name__
    secrets = [urlsplit(url).password]
    if sentinel.is_sentinel(url):
        try:
            secrets.append(sentinel.parse(url).sentinel_password)
        except ValueError:
            pass
    for secret in filter(None, secrets):
        detail = detail.replace(secret, "***")
    url = redacted(url)
    if isinstance(exc, redis.AuthenticationError):
        return f"Redis at {url} refused the login ({detail}); check the password (and user) in PREWARM_REDIS_URL"
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | OperationalError):
        return (f"cannot reach Redis at {url} ({detail}); check PREWARM_REDIS_URL and that Redis is running "
                "and reachable there")
    return f"Redis at {url} failed: {type(exc).__name__}: {detail}"
