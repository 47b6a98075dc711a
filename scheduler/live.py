"""The live scheduler: every tick, snapshot → `plan` → dispatch, while it holds the leader lock.

    tick:  leadership.ensure()            one planner at a time (redis-py Lock with a TTL)
           snapshot = reader.read(...)    I/O: catalog, traffic, fleet, replicas, intents
           actions = plan(snapshot, now)  pure
           dispatch_all(actions, gpus)    one batch of the dispatcher (send_many): claims an intent per
                                          (model, gpu) — (model, host_id(node)) for the host cache —
                                          for every action in one round trip, sends the tasks by name to
                                          the GPUs' queues over one broker connection, and records them
                                          in one more round trip

Stage/Unstage act on a node's host cache: the task goes to the queue of the node's first alive GPU (sorted
by id), and is skipped when the node has none (nothing there could run it). The dispatcher records every
sent action in the event log.

A model whose spec makes the policy raise is left out of the plan and the others are planned
(scheduler.isolation): logged, a `plan_failed` event, counted in prewarm_scheduler_plan_failures{model}, and
listed in each tick's result (`left_out`) and in the status hash until its spec changes.

A standby runs the same ticks and plans nothing until it gets the lock. The dispatcher's intents are
claimed atomically, so even two schedulers that both believe they lead never send one action twice.

Wake-ups: the route hook PUBLISHes a model on keys.WAKE when a lookup opens a cold episode (a router waits).
A listener thread subscribed to it runs one extra tick at once when this process leads (a standby ignores
it): messages that arrive together, or while a tick runs, are drained into one tick, and ticks never
overlap (one lock for the periodic and the woken ones). That tick records a "wake" event naming the models.
The listener resubscribes after Redis goes away, and stops with the process.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from prewarm import events, failover, keys, metrics_defs, state
from prewarm.context import Context
from prewarm.dispatch import Answer, Dispatched, Order, order_preload
from prewarm.domain.choice import Policy, make_policy
from prewarm.domain.policy import Action, Evict, Keep, PolicyConfig, Preload, Snapshot, Stage, Unstage
from prewarm.domain.policy import native as policy_native
from prewarm.domain.whole import HOME
from prewarm.heap import Heap
from prewarm.redis_round_trips import count_round_trips
from prewarm.services import drain
from prewarm.store import memory_time
from prewarm.store import policy as running_policy
from scheduler.failover import FailoverGuard
from scheduler.isolation import Isolation
from scheduler.leader import Leadership
from scheduler.snapshot import SnapshotReader
from scheduler.steering import Steering

log = logging.getLogger(__name__)

KEEP_REPEAT_S = 600.0  # a decision to keep a replica as it is, logged again after this long


@dataclass
class TickResult:
    leader: bool
    actions: int = 0
    dispatched: int = 0
    seconds: float = 0.0
    # The parts of `seconds` (the rest is the leader lock and the status write) and the tick's Redis round
    # trips on prewarm's own connection: what prewarm_scheduler_tick_part_seconds and
    # prewarm_scheduler_redis_round_trips record, and what `prewarm bench tick` reports.
    snapshot_seconds: float = 0.0
    plan_seconds: float = 0.0
    dispatch_seconds: float = 0.0
    round_trips: int = 0
    # The same parts in this process's CPU seconds (time.process_time): on a machine shared with other
    # work the wall-clock parts include waiting for a core; these do not (Redis's own CPU is not in them).
    snapshot_cpu_seconds: float = 0.0
    plan_cpu_seconds: float = 0.0
    dispatch_cpu_seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    # models left out of this tick's plan (their spec made the policy raise) -> what it raised
    left_out: dict[str, str] = field(default_factory=dict)
    woken_by: list[str] = field(default_factory=list)  # "<model>@<version>" of the cold lookups that woke it


class Scheduler:
    def __init__(self, ctx: Context, *, ident: str | None = None, config: PolicyConfig | None = None) -> None:
        self.ctx = ctx
        self.ident = ident or f"{socket.gethostname()}:{os.getpid()}"
        self.config = config or PolicyConfig(tick_s=ctx.settings.tick_seconds,
                                             speculative_share=ctx.settings.speculative_share,
                                             max_loads_per_gpu=ctx.settings.max_loads_per_gpu,
                                             idle_memory_budget=ctx.settings.idle_memory_budget,
                                             overdue_wait_s=ctx.settings.max_demand_wait,
                                             no_regret=ctx.settings.no_regret,
                                             whole_experts=ctx.settings.whole_experts,
                                             link_wait=ctx.settings.link_wait,
                                             refute_stale_rate=ctx.settings.refute_stale_rate,
                                             fill_share=ctx.settings.fill_share)
        self.round_trips = count_round_trips(ctx.r)  # before the leader lock makes its first connection
        self.leadership = Leadership(ctx.r, self.ident, ctx.settings.leader_ttl)
        self.failover = FailoverGuard(ctx, self.ident)  # a Redis failover: hold, reconcile (scheduler.failover)
        self._unacted: failover.Epoch | None = None  # a failover seen as standby, acted on if it takes the lead
        self.reader: SnapshotReader | None = None
        self.policy: Policy | None = None
        self.isolation = Isolation()
        self._tick_lock = threading.Lock()  # periodic and woken ticks never run at once
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        self._waiting = False  # the last tick's snapshot had requests waiting (a "ready:" wake-up may help them)
        slo_target = ctx.settings.cold_start_slo
        self.steering = None if slo_target is None else Steering(slo_target, self.config, ctx.settings.event_log_max)
        self._accounted_at: float | None = None  # memory-time is accounted up to here (memory_time)
        self._kept: dict[tuple[str, str, str], float] = {}  # (model, gpu, kind) -> last `keep` event logged
        self.heap = Heap()  # the process's collector, settled by run()'s ticks (settled_tick)

    def _reset(self) -> None:
        # A fresh history and policy cache whenever we (re)gain the lead: what a previous term fed may be
        # stale, and Redis may have been wiped in between.
        self.reader = SnapshotReader(self.ctx.r, self.config)
        self._accounted_at = None
        if self.steering is not None:
            self.steering.reset()
        self.policy = self._choose_policy()
        self.isolation = Isolation()

    def _choose_policy(self) -> Policy:
        """The policy PREWARM_POLICY names, fresh for this term. Starting with another one than the last
        leader recorded is an operator's change of policy: an event in the decision log."""
        name = self.ctx.settings.policy
        before = running_policy.swap(self.ctx.r, name, self.ident)
        if before is not None and before.name != name:
            events.record(self.ctx.r, "policy", "operator",
                          reason=f"scheduler policy changed from {before.name} to {name} (PREWARM_POLICY; "
                                 f"scheduler {self.ident})",
                          numbers={"from": before.name, "to": name, "scheduler": self.ident},
                          maxlen=self.ctx.settings.event_log_max)
            log.info("policy changed from %s to %s", before.name, name)
        return make_policy(name, self.config)

    def _fresh_policy(self) -> Policy:
        return make_policy(self.ctx.settings.policy, self.config)

    def _plan(self, snap: Snapshot, now: float) -> list[Action]:
        """The policy's actions for `snap`, without the models whose spec makes it raise (see isolation)."""
        assert self.reader is not None and self.policy is not None
        planned, back = self.isolation.view(snap)
        if back:  # their spec changed: planned again, by a policy whose cache has all the models
            log.info("planning %s again: its spec changed", ", ".join(back))
            self.policy = self._fresh_policy()
        try:
            return self.policy.decide(planned, now, self.reader.arrivals)
        except Exception as exc:
            return self._plan_around(snap, now, exc)

    def _plan_around(self, snap: Snapshot, now: float, error: Exception) -> list[Action]:
        assert self.reader is not None
        failures = metrics_defs.in_process_counter(metrics_defs.SCHEDULER_PLAN_FAILURES)
        try:
            self.policy, actions, found = self.isolation.isolate(self._fresh_policy, snap, now,
                                                                 self.reader.arrivals, error)
        except Exception:
            failures.labels("").inc()
            self.policy = self._fresh_policy()  # the failed call may have left its cache half updated
            raise
        for key, why in found.items():
            failures.labels(key).inc()
            ref = self.reader.refs.get(key)
            log.error("planning %s failed (%s): left out of the plan until its spec changes; the other models "
                      "are planned", key, why)
            events.record(self.ctx.r, "plan_failed", "scheduler", model=ref.id if ref else key,
                          reason=f"planning {key} failed ({why}): left out of the plan until its catalog entry or "
                                 "measured load time changes; the other models are planned",
                          numbers={"error": why, "version": ref.version if ref else ""},
                          maxlen=self.ctx.settings.event_log_max)
        return actions

    def tick(self, now: float | None = None, *, woken_by: Sequence[str] = ()) -> TickResult:
        """One planning round. `woken_by`: the models whose cold route lookups asked for this extra tick
        (empty for the periodic one); recorded as a "wake" event with what the tick did."""
        started = time.perf_counter()
        trips_before = self.round_trips.value
        was_leader = self.leadership.is_leader
        now = time.time() if now is None else now
        changed = self.failover.observe(now)  # the master's run id: a failover since the last tick?
        if changed is not None:
            self._unacted = changed
        if not self.leadership.ensure():
            self.reader = None
            return TickResult(False)
        if not was_leader or self.reader is None:
            self._reset()
            self.failover.took_lead(now)
            events.record(self.ctx.r, "leader", "scheduler", reason=f"scheduler {self.ident} took the lead")
        if self._unacted is not None:
            e, self._unacted = self._unacted, None
            # (within an intent TTL: later, whatever the failover lost has expired by itself)
            if e.failover_at is not None and now < e.failover_at + self.ctx.settings.intent_ttl:
                self.failover.begin(e, now)
        assert self.reader is not None
        catalog = self.ctx.catalog
        if self.steering is not None:  # the SLO moves the speculative budget before the plan
            self.reader.config = self.steering.tick(self.ctx.r, self.reader.config, now)
        t_snapshot, c_snapshot = time.perf_counter(), time.process_time()
        snap, fleet = self.reader.read(catalog, now)
        self._waiting = bool(snap.waiting)
        memory_time.account(self.ctx.r, fleet, self._accounted_at, now)
        self._accounted_at = now
        t_plan, c_plan = time.perf_counter(), time.process_time()
        # No drain replacements while a failover's hold lasts: the fleet view may still be missing GPUs.
        replaced = [] if self.failover.holding(now) else self._drain_round(fleet, now)
        actions = self._plan(snap, now)
        if replaced:  # the plan does not see the draining GPUs: it must not load what the round just placed
            homes = {(x.model, x.version) for x in replaced}
            actions = [a for a in actions if not (isinstance(a, Preload) and (ref := self.reader.refs.get(a.model))
                                                  and (ref.id, ref.version) in homes)]
        actions = self.failover.filter(actions, fleet, now)  # the hold after a failover
        t_dispatch, c_dispatch = time.perf_counter(), time.process_time()
        result = TickResult(True, actions=len(actions), woken_by=list(woken_by),
                            left_out={m: x.reason for m, x in self.isolation.left_out.items()})
        gpus = {g.id: g for g in fleet.alive()}
        try:
            answers = self.dispatch_all(actions, gpus, now)
        except redis.RedisError:
            raise  # Redis went away: safe_tick rebuilds leadership and history
        except Exception as exc:  # e.g. no broker connection: nothing of this plan was sent
            log.exception("dispatch of %d action(s) failed", len(actions))
            answers = [exc] * len(actions)
        for action, d in zip(actions, answers, strict=True):
            if isinstance(d, Exception):  # one failed send does not lose the rest of the plan
                log.error("dispatch of %s failed: %s", action, d)
                result.errors.append(str(d))
            else:
                result.dispatched += int(d is not None and d.sent)
        self.failover.reconcile(fleet, now)  # once, when a failover's hold is over: lost preloads sent again
        self.failover.left_behind(fleet, now)  # once a term: what a killed leader claimed and never sent
        done, c_done = time.perf_counter(), time.process_time()
        result.snapshot_seconds, result.plan_seconds = t_plan - t_snapshot, t_dispatch - t_plan
        result.dispatch_seconds = done - t_dispatch
        result.snapshot_cpu_seconds, result.plan_cpu_seconds = c_plan - c_snapshot, c_dispatch - c_plan
        result.dispatch_cpu_seconds = c_done - c_dispatch
        result.seconds = done - started
        if woken_by:
            self._record_wake(result)
        assert self.policy is not None
        self.ctx.r.hset(keys.SCHEDULER_STATUS, mapping={
            "leader": self.ident, "last_tick": f"{now:.3f}", "tick_seconds": f"{result.seconds:.4f}",
            "actions": result.actions, "dispatched": result.dispatched,
            "trigger": "wake" if woken_by else "interval", "policy": self.policy.name,
            "left_out": ",".join(sorted(result.left_out)), "expert": self._expert(),
            "loads_ahead": self._loads_ahead(), "fills": self._fills(), "link_waits": self._link_waits(),
            "stale_rates": self._stale_rates(),
            "failover_hold": "1" if self.failover.holding(now) else "0"})
        result.round_trips = self.round_trips.value - trips_before  # the status write included
        return result

    def _expert(self) -> str:
        """Which expert of the no-regret layer leads and why (prewarm's policy with the layer on), else "": who
        plans: prewarm, or (first) a whole baseline whose shadow fleet leads (prewarm.domain.whole)."""
        st = getattr(self.policy, "state", None)
        if st is None or not self.config.no_regret:
            return ""
        orders = str(st.experts.why())
        whole = getattr(self.policy, "whole", None)
        if whole is None or not self.config.whole_experts or not whole.shape:
            return orders
        return f"{whole.why()}; {orders}" if whole.leader != HOME else f"{orders}; {whole.why()}"

    def _loads_ahead(self) -> str:
        """What loads ahead saved and cost on this traffic, and whether they go on (ahead.py), else ""."""
        st = getattr(self.policy, "state", None)
        if st is None or not self.config.ahead_gate:
            return ""
        return str(st.ahead.why())

    def _fills(self) -> str:
        """Whether the fill takes all free memory on this traffic, and the first-request record behind it
        (firsts.py), else ""."""
        st = getattr(self.policy, "state", None)
        if st is None or not self.config.fill_free_memory:
            return ""
        return str(st.firsts.why())

    def _link_waits(self) -> str:
        """The demand loads prewarm's plan held back for a busy link at this tick, and why (PolicyConfig.link_wait),
        else "": such a wait sends nothing, so no event names it."""
        st = getattr(self.policy, "state", None)
        if st is None or not self.config.link_wait:
            return ""
        return str(st.link_wait_why())

    def _stale_rates(self) -> str:
        """Whether a silent model's measured rate is refuted on this traffic and the record behind it (silences.py),
        else "": only the automatic reading (PolicyConfig.refute_stale_rate "auto") has one."""
        if getattr(self.policy, "state", None) is None or self.config.refute_stale_rate != "auto":
            return ""
        return self.reader.history.silences.why()

    def _drain_round(self, fleet: state.Fleet, now: float) -> list[drain.Replacement]:
        """services.drain's round: replacements for the draining nodes' replicas that need a home."""
        try:
            return drain.drain_round(self.ctx, fleet, now)
        except redis.RedisError:
            raise  # Redis went away: safe_tick rebuilds leadership and history
        except Exception:  # e.g. no broker connection: tried again next tick; the plan goes on
            log.exception("drain round failed")
            return []

    def _record_wake(self, result: TickResult) -> None:
        nodes = [m.removeprefix(drain.WAKE_PREFIX) for m in result.woken_by if m.startswith(drain.WAKE_PREFIX)]
        ready = [m.removeprefix(keys.WAKE_READY) for m in result.woken_by if m.startswith(keys.WAKE_READY)]
        models = [m for m in result.woken_by if not m.startswith((drain.WAKE_PREFIX, keys.WAKE_READY))]
        only = models[0].partition("@")[0] if len(models) == 1 else ""
        why = " and ".join(
            ([f"a cold route lookup for {', '.join(models)}"] if models else [])
            + ([f"the drain of {', '.join(nodes)}"] if nodes else [])
            + ([f"{', '.join(ready)} turning ready while requests wait ({self.policy.name if self.policy else ''} "
                "places waiting misses as loads finish)"] if ready else []))
        events.record(
            self.ctx.r, "wake", "scheduler", model=only,
            reason=f"woken by {why}: planned at once instead of at the "
                   f"next tick (every {self.ctx.settings.tick_seconds:g} s): {result.actions} action(s), "
                   f"{result.dispatched} dispatched",
            numbers={"trigger": "cold_route" if models else "drain" if nodes else "ready", "models": models,
                     "nodes": nodes, "ready": ready,
                     "actions": result.actions,
                     "dispatched": result.dispatched, "scheduler": self.ident},
            maxlen=self.ctx.settings.event_log_max)

    def dispatch(self, action: Action, gpus: dict[str, state.Gpu], now: float | None = None) -> Dispatched | None:
        """Send one planned action through the dispatcher. `gpus`: the alive GPUs by id. None: skipped (its
        model is unknown to this tick's snapshot, or its GPU — for Stage/Unstage, every GPU of its node — is
        not alive); otherwise the dispatcher's answer (`sent` False: an action on it is already in flight).
        A failed publish raises."""
        [d] = self.dispatch_all([action], gpus, now)
        if isinstance(d, Exception):
            raise d
        return d

    def dispatch_all(self, actions: Sequence[Action], gpus: dict[str, state.Gpu],
                     now: float | None = None) -> list[Answer | None]:
        """`dispatch` for a whole plan as one batch of the dispatcher (a few round trips whatever its size):
        one answer per action (dispatch.Answer), None for an action skipped (its model left the catalog)."""
        assert self.reader is not None, "dispatch runs after a snapshot (a tick as leader)"
        answers: list[Answer | None] = [None] * len(actions)
        orders: list[Order] = []
        at: list[int] = []  # the action each order is for
        for i, action in enumerate(actions):
            order = self._order(action, gpus, now)
            if order is not None:
                orders.append(order)
                at.append(i)
        for i, d in zip(at, self.ctx.dispatcher.send_many(orders), strict=True):
            answers[i] = d
            if isinstance(d, Exception) or not d.sent:
                continue
            action = actions[i]
            if isinstance(action, Evict):
                self.reader.note_eviction(action.model, time.time() if now is None else now)
            log.info("%s %s on %s (%s): %s", type(action).__name__.lower(), action.model, d.gpu, action.kind,
                     action.reason)
        return answers

    def _order(self, action: Action, gpus: dict[str, state.Gpu], now: float | None) -> Order | None:
        """The dispatcher's order for a planned action; None: skipped (see `dispatch`)."""
        assert self.reader is not None
        ref = self.reader.refs.get(action.model)
        if ref is None:
            return None
        numbers = dict(action.numbers)
        # result=False: nobody reads the results of the scheduler's tasks (see Order.result)
        common = {"actor": "scheduler", "reason": action.reason, "numbers": numbers, "kind": action.kind,
                  "result": False}
        if isinstance(action, Stage | Unstage):
            carrier = state.node_carrier(gpus.values(), action.node)
            if carrier is None:
                return None
            if isinstance(action, Stage):
                return Order("stage", ref.id, ref.version, carrier, value=action.value, **common)
            return Order("unstage", ref.id, ref.version, carrier, **common)
        g = gpus.get(action.gpu)
        if g is None:
            return None
        if isinstance(action, Keep):
            self._record_keep(action, ref.id, now)
            return None
        if isinstance(action, Preload):
            return order_preload(ref.id, ref.version, g, priority=self._priority(ref.id, ref.version), **common)
        if isinstance(action, Evict):
            return Order("evict", ref.id, ref.version, g, **common)
        return None

    def _priority(self, model: str, version: str) -> str | None:
        try:
            return self.ctx.catalog.get(model, version).priority
        except KeyError:
            return None

    def _record_keep(self, action: Keep, model: str, now: float | None) -> None:
        """A `keep` event for a decision to leave a replica as it is (e.g. a refresh with no room): once per
        replica and kind while the policy keeps deciding it, again after KEEP_REPEAT_S."""
        at = time.time() if now is None else now
        key = (action.model, action.gpu, action.kind)
        if at - self._kept.get(key, -math.inf) < KEEP_REPEAT_S:
            return
        self._kept[key] = at
        events.record(self.ctx.r, "keep", "scheduler", model=model, gpu=action.gpu, reason=action.reason,
                      numbers={**action.numbers, "kind": action.kind}, maxlen=self.ctx.settings.event_log_max)

    def safe_tick(self, woken_by: Sequence[str] = ()) -> TickResult | None:
        with self._tick_lock:
            try:
                res = self.tick(woken_by=woken_by)
                if res.leader:
                    observe_tick(res)
                    if res.dispatched or woken_by:
                        log.info("%s: %d actions, %d dispatched in %.3f s",
                                 f"tick woken by {', '.join(woken_by)}" if woken_by else "tick", res.actions,
                                 res.dispatched, res.seconds)
                return res
            except redis.RedisError as exc:
                # Redis down or restarted: keep ticking; leadership and history are rebuilt when it is back.
                log.warning("tick skipped, Redis unavailable: %s", exc)
                self.leadership.is_leader = False
                self.reader = None
            except Exception:
                log.exception("tick failed")
            return None

    def settled_tick(self) -> TickResult | None:
        """The periodic tick of a scheduler process (run): safe_tick, then the collector settled once a new
        reader has built its records (prewarm/heap.py), so that a full pass over them does not land in a later tick."""
        res = self.safe_tick()
        with self._tick_lock:
            self.heap.settle(self.reader)
        return res

    def wake(self, models: Sequence[str]) -> TickResult | None:
        """A cold route lookup asked for a plan now: tick at once if this process leads; a standby ignores it
        (its periodic tick is what takes over the lead). A replica turned ready ("ready:" messages) asks only
        where the policy in use places waiting misses on that event and the last tick saw requests wait; else
        those wait for the next tick. None: ignored, or the tick failed."""
        if not self.leadership.is_leader:
            log.info("standby: wake-up for %s ignored", ", ".join(models))
            return None
        if all(m.startswith(keys.WAKE_READY) for m in models) and not self._ready_wakes():
            return None
        return self.safe_tick(woken_by=models)

    def _ready_wakes(self) -> bool:
        return self._waiting and self.policy is not None and self.policy.wakes_on_ready()

    def _listen(self) -> None:
        pubsub: redis.client.PubSub | None = None
        backoff = 0.5
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    pubsub = self.ctx.r.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(keys.WAKE)
                msg = pubsub.get_message(timeout=1.0)
                backoff = 0.5
                if msg is None:
                    continue
                # Coalesce a burst: everything already delivered goes into this one tick.
                woken = {_text(msg["data"])}
                while (more := pubsub.get_message(timeout=0.0)) is not None:
                    woken.add(_text(more["data"]))
                self.wake(sorted(woken))
            except redis.RedisError as exc:
                # Redis down or restarted: resubscribe when it is back. It may have lost everything, so the
                # next tick rebuilds its history as after a new lead (the periodic ticks do the same).
                log.warning("wake-up listener lost Redis, resubscribing in %.1f s: %s", backoff, exc)
                _close(pubsub)
                pubsub = None
                with self._tick_lock:
                    self.reader = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception:
                log.exception("wake-up listener failed; going on")
                self._stop.wait(1.0)
        _close(pubsub)

    def start_listener(self) -> None:
        """Subscribe to keys.WAKE in a daemon thread (it dies with the process; stop_listener ends it sooner)."""
        self._stop.clear()
        self._listener = threading.Thread(target=self._listen, name="prewarm-wake", daemon=True)
        self._listener.start()

    def stop_listener(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.join(timeout)
            self._listener = None

    def run(self) -> None:
        from apscheduler.schedulers.blocking import BlockingScheduler

        sched = BlockingScheduler()
        sched.add_job(self.settled_tick, "interval", seconds=self.ctx.settings.tick_seconds, max_instances=1,
                      coalesce=True)
        log.info("scheduler %s ticking every %.1f s (leader lock TTL %.0f s), woken at once by cold route "
                 "lookups; policy %s (%s)", self.ident, self.ctx.settings.tick_seconds, self.ctx.settings.leader_ttl,
                 self.ctx.settings.policy, "native build" if policy_native.active() else "pure Python (python -m prewarm.domain.policy build)")
        self.settled_tick()
        self.start_listener()
        try:
            sched.start()
        finally:
            self.stop_listener()
            self.leadership.release()


def observe_tick(res: TickResult) -> None:
    """Record a tick as leader in this process's Prometheus metrics (docs/metrics.md)."""
    m = metrics_defs
    m.in_process(m.SCHEDULER_TICK).observe(res.seconds)
    part = m.in_process(m.SCHEDULER_TICK_PART)
    for name, seconds in zip(m.TICK_PARTS, (res.snapshot_seconds, res.plan_seconds, res.dispatch_seconds),
                             strict=True):
        part.labels(name).observe(seconds)
    m.in_process(m.SCHEDULER_ROUND_TRIPS).observe(res.round_trips)
    m.in_process(m.SCHEDULER_PLAN_ACTIONS).observe(res.actions)


def _text(data: object) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else str(data)


def _close(pubsub: redis.client.PubSub | None) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except Exception:  # closing a connection to a Redis that is gone
            pass
