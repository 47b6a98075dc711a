"""The store: every record's read and write, beside keys.py (which spells the keys).

Web, scheduler, worker and CLI call these; none of them parses or writes one of these records by hand.
One module per record family:

    cold_starts      open cold-start episodes (route hook) and their closing (the replica's ready)
    ready            what a replica turning ready records, at that moment, in one transaction
    load_times       measured load and promotion seconds (worker writes, scheduler and API read)
    histograms       Redis-backed Prometheus histograms (observed in any process, exposed by web)
    overlays         operator pins and rollouts
    dispatch_counts  actions dispatched, per action and kind
    policy           the policy the leader scheduler runs (PREWARM_POLICY), for the API and console
    eta_promises     the first ETA the route hook gave a cold model, and how well it held
    load_kinds       why each replica was loaded (ahead of demand or on it), for the ROI's cold starts avoided
    lookup_counts    per-minute route lookup outcomes per model (the SLO controller's window, /api/roi)
    memory_time      GPU memory-time held per model (accounted by the leader scheduler each tick)
    slo_state        the cold-start SLO controller's level, carried from one leader to the next
    drains           the nodes being drained (no new preloads) or drained, with who began it and when

The fleet's records (GPUs, replicas, host caches, intents) have their store in prewarm/state.py.
"""
