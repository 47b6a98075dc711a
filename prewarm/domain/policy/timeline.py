"""Each model's timeline in the PolicyState: when it turns hot or cold (segments of its idle-time
model from its last arrival), brought up to `now` and the traffic's latest changes once per call.

Carried from call to call, it decides as a fresh state would: a model's timeline is rescheduled
when its traffic changes and when its spec does (a new `snapshot.models` mapping is compared with
the last one spec by spec, so a tick where one model's measured load time moved reschedules that
model, not all 10,000). Each heap entry carries the key of the timeline it came from, so an entry
of a replaced timeline is dropped when it comes up."""

from __future__ import annotations

import heapq
import math
import statistics
from bisect import bisect_left, insort
from collections.abc import Mapping

from .firsts import FirstRequests
from .types import ModelSpec, PolicyConfig
from .value import Values, load_seconds

# Above this many catalog changes in one call the fill's list is rebuilt, not edited entry by entry.
_EDIT_LIMIT = 64
# A heap of segments is swept of replaced timelines' entries once it holds more than this many per scheduled
# model, plus the floor (a sweep is O(heap): amortised over the pushes since the last one)
HEAP_SLACK = 8
HEAP_FLOOR = 4096


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
    old = st.scheduled.get(m)
    if old == key:
        return  # same origin, same timeline: the heaps already hold it
    if old is not None:
        # a new timeline (a new origin, histogram or load time): what the old one put in awake/due
        # no longer holds; its heap entries no longer match `scheduled` and are dropped when popped
        st.awake.pop(m, None)
        st.due.pop(m, None)
    st.scheduled[m] = key
    now = pl.now
    for start, end, label in am.segments:
        if a + end <= now:
            continue
        heap = st.hot_heap if label == "hot" else st.cold_heap
        heapq.heappush(heap, (a + start, m, a + end, key))


def _special(spec: ModelSpec) -> bool:
    return spec.pinned or spec.min_replicas > 0 or bool(spec.max_rate_per_replica)


def catalog_load(models: Mapping[str, ModelSpec], cfg: PolicyConfig) -> float:
    """The catalog's median load time, 0 for an empty catalog (placement.horizon)."""
    return statistics.median([load_seconds(sp, cfg) for sp in models.values()]) if models else 0.0


def _respecified(pl: Values, old: Mapping[str, ModelSpec], new: Mapping[str, ModelSpec]) -> list[str]:
    """Bring the state's catalog-derived parts (`special`, the fill's `unrequested`) from `old` to
    `new`, and forget the timelines of models no longer in the catalog. Returns the models of `new`
    whose spec differs from `old`'s (added ones included): their timelines are rescheduled."""
    st, tr, cfg = pl.st, pl.tr, pl.cfg
    changed: list[str] = []
    added = 0
    special = False  # a model joined or left the special ones
    for m, sp in new.items():
        o = old.get(m)
        if o is sp:
            continue
        if o is None:
            added += 1
        elif o == sp:
            continue
        changed.append(m)
        if _special(sp) != (o is not None and _special(o)):
            special = True
    # len(new) = len(old) + added - removed
    removed = [m for m in old if m not in new] if len(old) + added != len(new) else []
    for m in removed:
        special = special or _special(old[m])
        for d in (st.awake, st.due, st.recent, st.scheduled, st.value, st.arrival):
            d.pop(m, None)
    if special:
        st.special = tuple(sorted(m for m, s in new.items() if _special(s)))
    if changed or removed:
        st.catalog_load_s = catalog_load(new, pl.cfg)
    # the fill's list: (load s, model) of the catalog's models with no request, shortest first
    edits = [m for m in removed if m in st.unrequested_ids]
    edits += [m for m in changed if tr.last_arrival(m) is None]
    if len(edits) > _EDIT_LIMIT:
        st.unrequested = sorted((load_seconds(s, cfg), m) for m, s in new.items() if tr.last_arrival(m) is None)
        st.unrequested_ids = {m for _ld, m in st.unrequested}
    else:
        for m in edits:
            if m in st.unrequested_ids:
                x = (load_seconds(old[m], cfg), m)
                i = bisect_left(st.unrequested, x)
                del st.unrequested[i]
                st.unrequested_ids.discard(m)
            now_spec = new.get(m)
            if now_spec is not None:
                insort(st.unrequested, (load_seconds(now_spec, cfg), m))
                st.unrequested_ids.add(m)
    return changed


def advance(pl: Values) -> None:
    """Bring the state's timeline up to `now` and the traffic's latest changes."""
    st, snap, tr, now = pl.st, pl.s, pl.tr, pl.now
    new_config = st.config is not snap.config and st.config != snap.config
    fresh = st.traffic_id != id(tr) or st.seq < 0 or new_config or st.models is None
    changed: list[str]
    if fresh:
        if st.traffic_id != id(tr) or new_config:
            # arrival models and value inputs are keyed by histogram version and load time (or
            # spec), so they survive a new catalog object (a live scheduler may rebuild it every tick)
            st.arrival.clear()
            st.value.clear()
        st.traffic_id, st.config = id(tr), snap.config
        st.hot_heap.clear()
        st.cold_heap.clear()
        st.awake.clear()
        st.due.clear()
        st.due_ends.clear()
        st.recent.clear()
        st.scheduled.clear()
        st.special = tuple(sorted(m for m, s in snap.models.items() if _special(s)))
        st.catalog_load_s = catalog_load(snap.models, pl.cfg)
        changed = tr.models()
        st.unrequested = sorted((load_seconds(sp, pl.cfg), m) for m, sp in snap.models.items()
                                if tr.last_arrival(m) is None)
        st.unrequested_ids = {m for _ld, m in st.unrequested}
        st.firsts = FirstRequests()
        st.firsts.observe(now, 0, len(st.unrequested), pl.cfg.expert_halflife_s)
    else:
        since = tr.changed_since(st.seq)
        changed = tr.models() if since is None else since
        # a model with a request leaves the fill's list (a set test per changed model, not a scan)
        asked = st.unrequested_ids.intersection(changed)
        if asked:
            st.unrequested = [x for x in st.unrequested if x[1] not in asked]
            st.unrequested_ids -= asked
        st.firsts.observe(now, len(asked), len(st.unrequested), pl.cfg.expert_halflife_s)
        if asked:
            of_model = pl.fleet.of_model
            st.firsts.fills_asked(sum(1 for m in asked if of_model.get(m)))
        if st.models is not snap.models:
            # (held, not just its id: a freed mapping's id can be reused by the next one)
            assert st.models is not None
            changed = [*changed, *_respecified(pl, st.models, snap.models)]
    # the state holds the mapping it was brought up to date with
    st.models = snap.models
    st.seq = tr.seq
    # a request moves a model's timeline (schedule() replaces it), and its value inputs no longer hold
    value = st.value
    for m in changed:
        value.pop(m, None)
    todo = [m for m in sorted(set(changed)) if m in snap.models]
    pl.prepare_arrivals([m for m in todo if tr.last_arrival(m) is not None])  # what schedule() reads, at once
    for m in todo:
        schedule(pl, m)
    scheduled, awake, due, due_ends = st.scheduled, st.awake, st.due, st.due_ends
    heap = st.hot_heap
    while heap and heap[0][0] <= now:
        _start, m, end, key = heapq.heappop(heap)
        if end > now and scheduled.get(m) == key:
            awake[m] = (end, key[0])
    heap = st.cold_heap
    while heap and heap[0][0] <= now:
        _start, m, end, key = heapq.heappop(heap)
        if end > now and scheduled.get(m) == key:
            due[m] = (end, key[0])
            heapq.heappush(due_ends, (end, m))
    # A replaced timeline's entries stay in the heaps until their start passes (40 to each live one on Azure
    # 1,350 × 8 after 6 h: a busy model's timeline is replaced every grid cell, its entries hours ahead): past a
    # bound they are swept out, so the heaps hold about the live segments whatever the request rate
    bound = HEAP_SLACK * len(scheduled) + HEAP_FLOOR
    for heap in (st.hot_heap, st.cold_heap):
        if len(heap) > bound:
            heap[:] = [e for e in heap if e[2] > now and scheduled.get(e[1]) == e[3]]
            heapq.heapify(heap)
    # ended cold segments leave `due`: each entry's end is in due_ends, so no scan of the whole dict
    while due_ends and due_ends[0][0] <= now:
        _end, m = heapq.heappop(due_ends)
        e = due.get(m)
        if e is not None and e[0] <= now:
            del due[m]
    cutoff = now - pl.cfg.demand_window_s
    for m in [m for m, a in st.recent.items() if a < cutoff]:
        del st.recent[m]
