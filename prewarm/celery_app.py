"""The Celery application shared by every process, and the task names.

Web, scheduler and CLI send tasks *by name* to a GPU's queue, so they never import the worker (or torch).
Delivery is at-least-once (`acks_late`): the worker's tasks are idempotent, and one redelivered after its
intent expired or was superseded is dropped as stale (gpu_worker/intents.py).
"""

from __future__ import annotations

import ssl
from urllib.parse import parse_qs, urlsplit

from celery import Celery

PRELOAD = "prewarm.preload"
EVICT = "prewarm.evict"
INFER = "prewarm.infer"
STAGE = "prewarm.stage"  # into the node's host cache (staging tier); any GPU queue of the node
UNSTAGE = "prewarm.unstage"


_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def tls_options(redis_url: str) -> dict[str, object]:
    """TLS settings for Celery's broker and backend from a rediss:// URL's query, the parameters redis-py
    reads itself for prewarm's own connections: ssl_cert_reqs, ssl_ca_certs, ssl_certfile, ssl_keyfile.
    Certificates are verified unless the URL says ssl_cert_reqs=none."""
    query = {k: v[-1] for k, v in parse_qs(urlsplit(redis_url).query).items()}
    reqs = query.get("ssl_cert_reqs", "required").lower()
    if reqs not in _CERT_REQS:
        raise ValueError(f"PREWARM_REDIS_URL: ssl_cert_reqs={reqs!r}; use required, optional or none")
    opts: dict[str, object] = {"ssl_cert_reqs": _CERT_REQS[reqs]}
    for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if key in query:
            opts[key] = query[key]
    return opts


def make_celery(redis_url: str, *, name: str = "prewarm") -> Celery:
    app = Celery(name, broker=redis_url, backend=redis_url)
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
    )
    if redis_url.startswith("rediss://"):
        ssl_opts = tls_options(redis_url)
        app.conf.broker_use_ssl = ssl_opts
        app.conf.redis_backend_use_ssl = ssl_opts
    return app
