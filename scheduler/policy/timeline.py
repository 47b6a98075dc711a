"""Each model's timeline in the PolicyState: when it turns hot or cold (segments of its idle-time
model from its last arrival), brought up to `now` and the traffic's latest changes once per call."""

from __future__ import annotations

import heapq
import math

from .value import Values, load_seconds


def schedule(pl: Values, m: str) -> None:
    """Push the model's future hot/cold segments (relative to its last arrival) onto the heaps."""
    st = pl.st
    last = pl.tr.last_arrival(m)
    if last is None:
        return
    st.recent[m] = last
    a = math.floor(last / pl.grid_s) * pl.grid_s  # anchor(), with the arrival already read
    am = pl.arrival(m)
    key = (a, st.arrival[m][0])
    if st.scheduled.get(m) == key:
        return  # same origin, same timeline: the heaps already hold it
    st.scheduled[m] = key
    now = pl.now
    for start, end, label in am.segments:
        if a + end <= now:
            continue
        heap = st.hot_heap if label == "hot" else st.cold_heap
        heapq.heappush(heap, (a + start, m, a, a + end))


def advance(pl: Values) -> None:
    """Bring the state's timeline up to `now` and the traffic's latest changes."""
    st, snap, tr, now = pl.st, pl.s, pl.tr, pl.now
    new_config = st.config is not snap.config and st.config != snap.config
    fresh = st.traffic_id != id(tr) or st.models_id != id(snap.models) or st.seq < 0 or new_config
    if fresh:
        if st.traffic_id != id(tr) or new_config:
            # arrival models and value inputs are keyed by histogram version and load time (or
            # spec), so they survive a new catalog object (a live scheduler may rebuild it every tick)
            st.arrival.clear()
            st.value.clear()
        st.traffic_id, st.models_id, st.config = id(tr), id(snap.models), snap.config
        st.hot_heap.clear()
        st.cold_heap.clear()
        st.awake.clear()
        st.due.clear()
        st.recent.clear()
        st.scheduled.clear()
        st.special = tuple(sorted(
            m for m, s in snap.models.items() if s.pinned or s.min_replicas > 0 or s.max_rate_per_replica
        ))
        changed = tr.models()
        st.unrequested = sorted((load_seconds(sp, pl.cfg), m) for m, sp in snap.models.items()
                                if tr.last_arrival(m) is None)
        st.unrequested_ids = {m for _ld, m in st.unrequested}
    else:
        since = tr.changed_since(st.seq)
        changed = tr.models() if since is None else since
        # a model with a request leaves the fill's list (a set test per changed model, not a scan)
        asked = st.unrequested_ids.intersection(changed)
        if asked:
            st.unrequested = [x for x in st.unrequested if x[1] not in asked]
            st.unrequested_ids -= asked
    st.seq = tr.seq
    # a request moves a model's timeline: its hot/cold segments from the old anchor no longer hold,
    # nor do its value inputs
    value = st.value
    for m in changed:
        value.pop(m, None)
        for segs in (st.awake, st.due):
            seg = segs.get(m)
            if seg is not None and seg[1] != pl.anchor(m):
                del segs[m]
    for m in sorted(set(changed)):
        if m in snap.models:
            schedule(pl, m)
    for heap, target in ((st.hot_heap, st.awake), (st.cold_heap, st.due)):
        while heap and heap[0][0] <= now:
            _start, m, a, end = heapq.heappop(heap)
            if end > now and pl.anchor(m) == a:
                target[m] = (end, a)
    for m in [m for m, (end, _a) in st.due.items() if end <= now]:
        del st.due[m]
    cutoff = now - pl.cfg.demand_window_s
    for m in [m for m, a in st.recent.items() if a < cutoff]:
        del st.recent[m]


