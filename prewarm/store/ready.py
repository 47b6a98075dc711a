"""What a replica turning ready records, at that moment (the worker calls this once per completed load).

In one MULTI/EXEC: its load+warmup seconds for the scheduler (load_times), its load and warmup in their
histograms, the close of its model's open cold start when this version ends it (cold_starts) with the delay
before its load that this shows (load_times.demand_delay), and of the
ETA the route hook promised for it, observing real − promised (eta_promises). Nothing
waits for a scrape or a route lookup to notice, so each event is counted once, even if nobody scrapes.
"""

from __future__ import annotations

import redis
from redis.client import Pipeline

from prewarm import keys, metrics_defs, state
from prewarm.store import cold_starts, eta_promises, histograms, load_times


def replica_ready(r: redis.Redis, replica: state.Replica) -> float | None:
    """Record `replica` (state ready, with its measured seconds; `since` = when it turned ready). Returns
    the cold start it closed, in seconds, or None."""

    def txn(pipe: Pipeline) -> float | None:
        closing = cold_starts.closing(pipe, replica.model, replica.version, replica.since)
        promised, counted = eta_promises.closing(pipe, replica.model, replica.version, replica.since)
        pipe.multi()
        pipe.publish(keys.WAKE, f"{keys.WAKE_READY}{replica.model}@{replica.version}")
        if promised:
            eta_promises.queue_close(pipe, replica.model, replica.version, replica.since, counted)
        load_times.push(pipe, replica)
        if replica.load_seconds is not None:
            histograms.observe(pipe, metrics_defs.MODEL_LOAD, replica.load_seconds)
        if replica.warmup_seconds is not None:
            histograms.observe(pipe, metrics_defs.MODEL_WARMUP, replica.warmup_seconds)
        if closing is None:
            return None
        closing.queue(pipe)
        if closing.seconds is not None:
            delay = load_times.demand_delay(closing.seconds, replica)
            if delay is not None:
                load_times.push_delay(pipe, delay)
        return closing.seconds

    # Watched on the open cold starts and promises: a route lookup closing the same episode meanwhile makes
    # this retry, and the retry finds it closed (the load itself is recorded once: only EXEC applies anything).
    return r.transaction(txn, keys.COLD_STARTS, keys.ETA_PROMISES, value_from_callable=True)
