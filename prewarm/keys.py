"""The Redis key layout: the one place that spells a key.

Everything prewarm keeps in Redis lives under the `pw:` prefix, so it can share a database with Celery's
own keys (broker queues, results) without collisions. Values are documented beside each key.
"""

from __future__ import annotations

PREFIX = "pw:"

# --- fleet (written by workers) ---------------------------------------------------------------
# Set of every GPU id ever announced; a GPU whose heartbeat key has expired is stale, not forgotten.
GPUS = PREFIX + "gpus"


def gpu(gpu_id: str) -> str:
    """Hash: the GPU's inventory (node, device, queue, total/used/free bytes, last_heartbeat, worker).

    Written by the worker's heartbeat with a TTL: the key vanishing is how a dead worker leaves the fleet.
    """
    return f"{PREFIX}gpu:{gpu_id}"


def replicas(gpu_id: str) -> str:
    """Hash model -> JSON replica record for one GPU, refreshed with the heartbeat's TTL."""
    return f"{PREFIX}replicas:{gpu_id}"


def worker_lock(gpu_id: str) -> str:
    """Claim that one live worker process serves this GPU (value: worker id), with a TTL."""
    return f"{PREFIX}claim:{gpu_id}"


# Hash node -> JSON drain record (prewarm.store.drains): a node taking no new preloads while its replicas
# that still have demand get a home elsewhere (state "draining"), then evicted ("drained"). Written by
# `prewarm drain`, the API and a worker on SIGTERM; removed by `prewarm undrain` or the node's next worker.
DRAINING = PREFIX + "draining"


# --- node host-memory cache: the staging tier (written by workers) ------------------------------------
# Set of every node whose worker announced a host cache; a node whose host_cache key expired is gone.
NODES = PREFIX + "nodes"


def host_cache(node: str) -> str:
    """Hash: the node's host cache inventory (budget_bytes, used_bytes, free_bytes, pinned, last_heartbeat,
    worker) and catalog_problems (JSON: the catalog entries its worker refused, entry -> problem), written
    with the heartbeat's TTL like a GPU's inventory."""
    return f"{PREFIX}hostcache:{node}"


def staged(node: str) -> str:
    """Hash model@version -> JSON staged record (state.Staged) of the node's host cache, heartbeat TTL."""
    return f"{PREFIX}staged:{node}"


# --- intents (in-flight actions not yet confirmed by a worker) ------------------------------------
def intent(model: str, gpu_id: str) -> str:
    """String JSON with a TTL: claimed with SET NX, so one action per (model, gpu) is in flight at once.

    Node-level actions (stage/unstage into the host cache) use state.host_id(node) as the `gpu_id`."""
    return f"{PREFIX}intent:{model}:{gpu_id}"


INTENT_PATTERN = PREFIX + "intent:*"


# redis-py Lock held by a route hook while it picks a GPU for an on-demand preload and dispatches it:
# concurrent cold lookups of different models must see each other's intents, not fill one gap twice.
ON_DEMAND_LOCK = PREFIX + "hooks:on-demand"


def cold_claim(model: str) -> str:
    """SET NX with a TTL: the route hook enqueues one on-demand preload per cold model, not one per call."""
    return f"{PREFIX}cold:{model}"


# --- traffic (written by the hooks) ----------------------------------------------------------------
def traffic_bucket(resolution_s: int, bucket_start: int) -> str:
    """Hash model -> request count for one time bucket, expiring by itself."""
    return f"{PREFIX}traffic:{resolution_s}:{bucket_start}"


REQUESTS_TOTAL = PREFIX + "requests_total"  # Hash model -> count since the store began.
LAST_REQUEST = PREFIX + "last_request"  # Sorted set model -> Unix seconds of the newest event seen.

# --- catalog overlays set by operators ---------------------------------------------------------------
PINNED = PREFIX + "pinned"  # Set of model ids pinned by an operator (on top of the catalog's `pinned`).
ROLLOUTS = PREFIX + "rollouts"  # Hash model -> JSON {version, traffic_fraction, since, from_version}.

# --- measurements -----------------------------------------------------------------------------------
def load_times(model: str) -> str:
    """List of the most recent measured load+warmup seconds (newest first, trimmed) of loads from storage."""
    return f"{PREFIX}loadtimes:{model}"


def promote_times(model: str) -> str:
    """List like load_times, for preloads promoted from a node's host cache (source "host"): kept apart so a
    fast promotion does not shorten the cold-load time the scheduler plans with."""
    return f"{PREFIX}promotetimes:{model}"


# The change log of the two lists above (written with them by prewarm.store.load_times.push), so the scheduler
# re-reads only the models measured since its last tick: a hash "n" -> measurements written so far and
# "epoch" -> a random id of this counter's life (a wiped Redis starts a new one), and a sorted set
# model -> the "n" of its newest measurement. (A "-" where model keys have ":", so no model id collides.)
MEASURED_VERSION = PREFIX + "loadtimes-version"
MEASURED_CHANGES = PREFIX + "loadtimes-changes"
# List of the most recent delays before a demand load (newest first, trimmed): a completed cold start's seconds
# minus its replica's own load and warmup, i.e. from the first cold lookup to the load's start (the wake-up or
# tick, the task's queueing, a worker taking it). prewarm.store.load_times writes and reads it.
DEMAND_DELAYS = PREFIX + "demand-delays"

COLD_STARTS = PREFIX + "cold_starts"  # Hash model -> JSON {seen_at, version} of an open cold start (route
#                                      saw it cold); prewarm.store.cold_starts reads and writes it.
LAST_COLD_START = PREFIX + "last_cold_start"  # Hash model -> seconds of the last completed cold start.
ETA_PROMISES = PREFIX + "eta_promises"  # Hash "<model>@<version>" -> JSON {at, eta}: the first ETA the route
#                                        hook gave for it since it was last ready (prewarm.store.eta_promises).
ETA_ERRORS = PREFIX + "eta_errors"  # List of JSON {model, version, at, promised, real}, newest first: the last
#                                    eta_promises.KEPT closed promises (the histogram's events, one by one).


def histogram(name: str) -> str:
    """Hash of a Redis-backed histogram (prewarm.store.histograms): "<le>" -> events in that bucket (not
    cumulative), "sum" -> the sum of the observed values. `name` is the metric's name."""
    return f"{PREFIX}histogram:{name}"


# --- per-minute records of the cold path (the SLO controller's windows, /api/roi) --------------------
MINUTE_TTL_S = 25 * 3600  # a minute's records live this long: windows of up to a day


def route_minute(minute: int) -> str:
    """Hash of one minute (its start, Unix s) of route lookups: "ready:<model>", "not_ready:<model>",
    "avoided:<model>" (warm hits on a replica loaded ahead of demand), "cold_start:<model>" (episodes
    opened) -> count, and "dur:<le>" -> cold starts completed that minute with a duration in that bucket.
    Expires after MINUTE_TTL_S (prewarm.store.lookup_counts)."""
    return f"{PREFIX}route:{minute}"


def memory_minute(minute: int) -> str:
    """Hash of one minute of GPU memory-time held, accounted by the leader scheduler each tick:
    "bytes:<model>" -> byte-seconds, "gpu:<model>" -> GPU-seconds (bytes / the GPU's total × seconds).
    Expires after MINUTE_TTL_S (prewarm.store.memory_time)."""
    return f"{PREFIX}memtime:{minute}"


LOAD_KINDS = PREFIX + "load_kinds"  # Hash "<model>@<version>|<gpu>" -> "<actor>:<kind>" of the last preload
#                                    dispatched there (prewarm.store.load_kinds): was a replica loaded ahead?
SLO_STATE = PREFIX + "slo"  # String JSON: the cold-start SLO controller's state, written by the leader each tick.

DISPATCH_COUNTS = PREFIX + "dispatch_counts"  # Hash "<action>:<kind>" -> actions dispatched (for metrics).

# --- decisions and leadership ---------------------------------------------------------------------
EVENTS = PREFIX + "events"  # Stream of decisions and actions (bounded with MAXLEN).
LEADER_LOCK = PREFIX + "scheduler:leader"  # redis-py Lock held by the planning scheduler.
# Hash: run_id (the Redis master's run id when last seen), failover_at (Unix seconds the run id last changed:
# a Sentinel failover or a restart), previous (the run id before). prewarm.failover.
REDIS_EPOCH = PREFIX + "redis:epoch"
# Hash: leader id, last tick, tick seconds, trigger, expert, loads_ahead, fills, link_waits, stale_rates.
SCHEDULER_STATUS = PREFIX + "scheduler:status"
SCHEDULER_POLICY = PREFIX + "scheduler:policy"  # Hash: the policy the leader runs (name, since, scheduler).
WAKE = PREFIX + "wake"  # Pub/sub channel: the route hook publishes "<model>@<version>" when a lookup opens a
#                        cold episode; the leader scheduler plans at once instead of at its next tick.
# keys.WAKE message "ready:<model>@<version>" of a replica turned ready (store.ready): the leader plans at once only
# where its policy places waiting misses when a load finishes (`wakes_on_ready`) and its last tick saw requests wait.
WAKE_READY = "ready:"

# --- web console sessions and the login throttle (written by web) ---------------------------------------
# String: the random key that signs console session cookies, created once with SET NX by whichever web
# process needs it first (so every gunicorn worker signs alike); unused when PREWARM_SECRET_KEY is set.
SESSION_SECRET = PREFIX + "web:session-secret"


def web_session(sid: str) -> str:
    """String JSON {created, client} with the session's lifetime as TTL: a logged-in console session is
    live only while this key exists; /logout deletes it."""
    return f"{PREFIX}session:{sid}"


LOGIN_ATTEMPTS_PREFIX = PREFIX + "login-attempts:"


def login_attempts(scope: str, window: int) -> str:
    """Counter of admin-token tries not (yet) succeeded in one throttle window, for one client
    ("client:<address>") or for all ("all"); expires with its window."""
    return f"{LOGIN_ATTEMPTS_PREFIX}{scope}:{window}"
