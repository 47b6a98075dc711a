"""The Celery application shared by every process, and the task names.

Web, scheduler and CLI send tasks *by name* to a GPU's queue, so they never import the worker (or torch).
Delivery is at-least-once (`acks_late`): the worker's tasks are idempotent, and one redelivered after its
intent expired or was superseded is dropped as stale (gpu_worker/intents.py).

Task events are on (worker_send_task_events, task_send_sent_event), so the tools operators already run
see prewarm's tasks: `celery -A prewarm.celery_app flower` (Flower, installed apart: it is not a
dependency) shows each task per GPU queue, sent to succeeded or failed, and `celery -A prewarm.celery_app
events` does the same in a terminal. `-A` finds the module's `app`, made on first use for the Redis that
prewarm's own commands find (PREWARM_REDIS_URL, else the one `prewarm up` / `./run` started). Events go
over Redis pub/sub: with nobody listening they cost a PUBLISH each and are kept nowhere.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from celery import Celery

from prewarm.sentinel import CERT_REQS

PRELOAD = "prewarm.preload"
EVICT = "prewarm.evict"
INFER = "prewarm.infer"
STAGE = "prewarm.stage"  # into the node's host cache (staging tier); any GPU queue of the node
UNSTAGE = "prewarm.unstage"


def tls_options(redis_url: str) -> dict[str, object]:
    """TLS settings for Celery's broker and backend from a rediss:// URL's query, the parameters redis-py
    reads itself for prewarm's own connections: ssl_cert_reqs, ssl_ca_certs, ssl_certfile, ssl_keyfile.
    Certificates are verified unless the URL says ssl_cert_reqs=none."""
    query = {k: v[-1] for k, v in parse_qs(urlsplit(redis_url).query).items()}
    reqs = query.get("ssl_cert_reqs", "required").lower()
    if reqs not in CERT_REQS:
        raise ValueError(f"PREWARM_REDIS_URL: ssl_cert_reqs={reqs!r}; use required, optional or none")
    opts: dict[str, object] = {"ssl_cert_reqs": CERT_REQS[reqs]}
    for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if key in query:
            opts[key] = query[key]
    return opts


def make_celery(redis_url: str, *, name: str = "prewarm") -> Celery:
    from prewarm import sentinel

    via_sentinel = sentinel.celery_config(sentinel.parse(redis_url)) if sentinel.is_sentinel(redis_url) else None
    app = Celery(name, broker=None if via_sentinel else redis_url, backend=None if via_sentinel else redis_url)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,  # a task lost with its worker is redelivered; tasks are idempotent
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue="prewarm.default",
        result_expires=3600,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": 3600},
        worker_hijack_root_logger=False,
        task_track_started=True,
        worker_send_task_events=True,  # received/started/succeeded/failed, for Flower and `celery events`
        task_send_sent_event=True,  # and "sent" from whoever dispatches, so a task queued for a GPU shows
    )
    if via_sentinel is not None:  # the sentinels' URLs, the master's name, the kombu fix (prewarm.sentinel)
        via_sentinel["broker_transport_options"] = {**app.conf.broker_transport_options,
                                                    **via_sentinel["broker_transport_options"]}
        app.conf.update(via_sentinel)
    elif redis_url.startswith("rediss://"):
        ssl_opts = tls_options(redis_url)
        app.conf.broker_use_ssl = ssl_opts
        app.conf.redis_backend_use_ssl = ssl_opts
    return app


def __getattr__(name: str) -> Celery:
    """`app`: the application for `celery -A prewarm.celery_app ...` (made when first asked for, so importing
    this module for the task names connects to nothing)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from prewarm import runtime
    from prewarm.config import Settings

    app = make_celery(runtime.redis_url(Settings.from_env(), start=False))
    globals()["app"] = app
    return app
