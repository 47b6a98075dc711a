"""The Celery application shared by every process, and the task names.

Web, scheduler and CLI send tasks *by name* to a GPU's queue, so they never import the worker (or torch).
Delivery is at-least-once (`acks_late`): the worker's tasks are idempotent.
"""

from __future__ import annotations

from celery import Celery

PRELOAD = "prewarm.preload"
EVICT = "prewarm.evict"
INFER = "prewarm.infer"
STAGE = "prewarm.stage"


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
        import ssl

        # Certificates are verified by default; the URL's ssl_cert_reqs parameter can relax that.
        app.conf.broker_use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        app.conf.redis_backend_use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    return app
