"""`prewarm worker`: one Celery worker process per node serving every device in PREWARM_DEVICES.

Each GPU has its own queue (`gpu.<node>.<device>`); the process consumes all of them with a thread pool,
so a preload running on a GPU (a thread busy reading weights) never stops `infer` on that GPU's ready
models from running on another thread. Device state lives in one `NodeWorker` shared by the threads.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

import redis

from gpu_worker import health
from gpu_worker.drain import NodeDrain
from gpu_worker.heartbeat import ClaimTaken, Heartbeat, claim_gpus, release_claims
from gpu_worker.residency import NodeWorker, WorkerOptions
from gpu_worker.runtimes.engine_records import EngineLeftRunning
from prewarm import runtime
from prewarm.celery_app import make_celery
from prewarm.config import Settings
from prewarm.dispatch import Dispatcher
from prewarm.store import drains

log = logging.getLogger("prewarm.worker")

EX_FAILURE = 1  # celery.platforms.EX_FAILURE: the worker stopped on an unrecoverable error


def default_threads(n_devices: int) -> int:
    # Room for a load per GPU plus several concurrent infers, with headroom for queued control tasks.
    return max(8, 4 * n_devices)


def run_worker(settings: Settings | None = None, *, threads: int | None = None, loglevel: str = "INFO") -> int:
    settings = settings or Settings.from_env()
    logging.basicConfig(level=getattr(logging, loglevel.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Celery logs every task received/succeeded at INFO (one line per infer); our own log says what matters.
    for noisy in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        devices = settings.devices()
        url = runtime.redis_url(settings)
        r = runtime.connect(url)
        worker = NodeWorker(r, settings.catalog, settings.node, devices, WorkerOptions.from_settings(settings),
                            engine_records=settings.data_dir / "engines")
        r.ping()
    except (ValueError, RuntimeError) as exc:  # a bad PREWARM_DEVICES, CUDA asked for but absent
        log.error("cannot start the worker: %s", exc)
        runtime.stop_owned()
        return 2
    except redis.RedisError as exc:
        log.error("cannot start the worker: Redis (PREWARM_REDIS_URL) does not answer: %s", exc)
        runtime.stop_owned()
        return 2
    cpu_budget = sum(d.budget_bytes or 0 for d in devices if not d.is_cuda)
    try:
        import psutil

        host = psutil.virtual_memory().total
        cache = worker.host_cache.budget_bytes
        if cpu_budget + cache > host:  # a promise the host cannot keep: warn before the OOM killer does
            log.warning("CPU virtual GPU budgets (%.1f GiB) and the host cache (%.1f GiB, PREWARM_HOST_CACHE) add "
                        "up to more than this host's %.1f GiB of memory", cpu_budget / 2**30, cache / 2**30,
                        host / 2**30)
    except ImportError:
        pass
    try:
        cat = worker.catalog()  # logs each refused entry by name
        log.info("catalog %s: %d models served, %d entries refused", settings.catalog, len(cat.models),
                 len(cat.problems))
    except Exception as exc:  # noqa: BLE001 - serve anyway: tasks fail with the catalog's reason
        log.error("catalog %s is not usable (%s); preloads will fail until it is fixed", settings.catalog, exc)

    # Until Celery installs its own handlers, SIGTERM/SIGINT stop us cleanly too (claims released, GPUs out).
    def early_stop(signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, early_stop)
    signal.signal(signal.SIGINT, early_stop)
    heartbeat: Heartbeat | None = None
    node_drain: NodeDrain | None = None
    exitcode = 0
    try:
        claim_gpus(worker)
        # A drain record left by an earlier worker of this node (its drain ended with its exit, or a kill cut
        # it short) is over: this worker is a fresh start and the node takes loads again.
        if drains.clear_for_new_worker(worker.r, worker.node, worker.worker_id, time.time(), settings.event_log_max):
            log.info("node %s was drained by its last worker; it takes loads again", worker.node)
        # Claims are refreshed from now on; the GPUs join the fleet once their queues are consumed.
        heartbeat = Heartbeat(worker, announce=False,
                              health_file=health.path_for(settings.data_dir, settings.node)).start()
        for g in worker.gpus.values():
            inv = g.device.inventory()
            log.info("serving %s on queue %s: %d bytes total (%s)", g.id, g.queue, inv.total_bytes,
                     g.device.kind)
        log.info("host cache of %s: %d bytes (PREWARM_HOST_CACHE)%s", worker.node, worker.host_cache.budget_bytes,
                 ", pinned" if worker.host_cache.pinned else "")

        from celery.signals import worker_ready, worker_shutting_down

        from gpu_worker import tasks

        hb = heartbeat

        def drained() -> None:  # the drain thread, once the node is empty: Celery's own warm shutdown
            os.kill(os.getpid(), signal.SIGTERM)

        node_drain = NodeDrain(worker, grace_s=settings.drain_grace, poll_s=settings.heartbeat_seconds,
                               dispatcher=lambda: Dispatcher(r, make_celery(url, name="prewarm-worker-drain"),
                                                             intent_ttl=settings.intent_ttl,
                                                             event_log_max=settings.event_log_max),
                               done=drained)
        nd = node_drain

        def on_ready(**_kw: object) -> None:
            hb.announce()
            _drain_on_sigterm(nd)
            nd.watch()  # from now on a drain can end in Celery's own shutdown
            log.info("worker %s ready: %s", worker.worker_id, ", ".join(worker.gpus))

        def on_shutting_down(**_kw: object) -> None:
            hb.stopping = True  # `prewarm probe ready` fails from here on
            n = worker.cancel_loads("the worker is shutting down")
            if n:
                log.info("shutting down: cancelled %d load(s) in progress", n)

        worker_ready.connect(on_ready, weak=False)
        worker_shutting_down.connect(on_shutting_down, weak=False)
        concurrency = threads or settings.worker_threads or default_threads(len(devices))
        # The resident models live in this process, so a broker failure must not end it: kombu's Redis
        # transport can die with an "Unrecoverable error" when Redis vanishes mid-ack (celery/kombu#970
        # and kin). Then we build a fresh Celery app and consumer and carry on serving the same replicas.
        backoff = 0.5
        while True:
            app = make_celery(url, name="prewarm-worker")
            tasks.register(app, worker)
            celery_worker = app.Worker(
                hostname=f"prewarm@{settings.node}.{os.getpid()}",
                queues=[g.queue for g in worker.gpus.values()],
                pool="threads",
                concurrency=concurrency,
                loglevel=loglevel.upper(),
                without_gossip=True,
                without_mingle=True,
                without_heartbeat=True,
                optimization="fair",
            )
            started = time.monotonic()
            celery_worker.start()
            exitcode = int(getattr(celery_worker, "exitcode", 0) or 0)
            if exitcode != EX_FAILURE:  # a requested (warm) shutdown exits 0: never retried
                break
            backoff = 0.5 if time.monotonic() - started > 30 else min(backoff * 2, 10.0)
            log.warning("Celery consumer failed (broker lost?); restarting it in %.1f s, replicas kept", backoff)
            time.sleep(backoff)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    except (ClaimTaken, EngineLeftRunning) as exc:
        log.error("%s", exc)
        exitcode = 1
    finally:
        if node_drain is not None:
            node_drain.stop_watching()
        if heartbeat is not None:
            heartbeat.stop()
        worker.shutdown()
        release_claims(worker)
        runtime.stop_owned()
        log.info("worker %s on %s stopped", worker.worker_id, socket.gethostname())
    return exitcode


def _drain_on_sigterm(node_drain: NodeDrain) -> None:
    """Put the drain in front of Celery's SIGTERM handler (installed by the time the worker is ready): the
    first SIGTERM begins the drain and the consumer serves on; once the node is drained (NodeDrain.finished)
    a SIGTERM — the drain's own — is Celery's warm shutdown, exit 0. SIGINT stays Celery's: a stop at once."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        log.warning("cannot hook SIGTERM from %s: a SIGTERM stops the worker without a drain",
                    threading.current_thread().name)
        return
    celery_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: object) -> None:
        if node_drain.finished.is_set():
            if callable(celery_term):
                celery_term(signum, frame)
            else:
                raise SystemExit(0)
            return
        node_drain.on_signal()

    signal.signal(signal.SIGTERM, on_term)
