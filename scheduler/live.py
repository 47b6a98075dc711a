"""The live scheduler: every tick, snapshot → `plan` → dispatch, while it holds the leader lock.

    tick:  leadership.ensure()            one planner at a time (redis-py Lock with a TTL)
           snapshot = reader.read(...)    I/O: catalog, traffic, fleet, replicas, intents
           actions = plan(snapshot, now)  pure
           dispatch(action, gpus)         dispatcher.preload/evict/stage/unstage: claims an intent per
                                          (model, gpu) — (model, host_id(node)) for the host cache —
                                          and sends the task by name to the GPU's queue

Stage/Unstage act on a node's host cache: the task goes to the queue of the node's first alive GPU (sorted
by id), and is skipped when the node has none (nothing there could run it). The dispatcher records every
sent action in the event log.

A standby runs the same ticks and plans nothing until it gets the lock. The dispatcher's intents are
claimed atomically, so even two schedulers that both believe they lead never send one action twice.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field

import redis

from prewarm import events, keys, state
from prewarm.context import Context
from prewarm.dispatch import Dispatched
from scheduler.leader import Leadership
from scheduler.policy import Action, Evict, PolicyConfig, PolicyState, Preload, Stage, Unstage, plan
from scheduler.snapshot import SnapshotReader

log = logging.getLogger(__name__)


@dataclass
class TickResult:
    leader: bool
    actions: int = 0
    dispatched: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


class Scheduler:
    def __init__(self, ctx: Context, *, ident: str | None = None, config: PolicyConfig | None = None) -> None:
        self.ctx = ctx
        self.ident = ident or f"{socket.gethostname()}:{os.getpid()}"
        self.config = config or PolicyConfig(tick_s=ctx.settings.tick_seconds,
                                             speculative_share=ctx.settings.speculative_share)
        self.leadership = Leadership(ctx.r, self.ident, ctx.settings.leader_ttl)
        self.reader: SnapshotReader | None = None
        self.policy_state: PolicyState | None = None

    def _reset(self) -> None:
        # A fresh history and policy cache whenever we (re)gain the lead: what a previous term fed may be
        # stale, and Redis may have been wiped in between.
        self.reader = SnapshotReader(self.ctx.r, self.config)
        self.policy_state = PolicyState()

    def tick(self, now: float | None = None) -> TickResult:
        started = time.perf_counter()
        was_leader = self.leadership.is_leader
        if not self.leadership.ensure():
            self.reader = None
            return TickResult(False)
        if not was_leader or self.reader is None:
            self._reset()
            events.record(self.ctx.r, "leader", "scheduler", reason=f"scheduler {self.ident} took the lead")
        assert self.reader is not None
        now = time.time() if now is None else now
        catalog = self.ctx.catalog
        snap, fleet = self.reader.read(catalog, now)
        actions = plan(snap, now, self.policy_state)
        result = TickResult(True, actions=len(actions))
        gpus = {g.id: g for g in fleet.alive()}
        for action in actions:
            try:
                d = self.dispatch(action, gpus, now)
                result.dispatched += int(d is not None and d.sent)
            except Exception as exc:  # one failed send must not lose the rest of the plan
                log.exception("dispatch of %s failed", action)
                result.errors.append(str(exc))
        result.seconds = time.perf_counter() - started
        self.ctx.r.hset(keys.SCHEDULER_STATUS, mapping={
            "leader": self.ident, "last_tick": f"{now:.3f}", "tick_seconds": f"{result.seconds:.4f}",
            "actions": result.actions, "dispatched": result.dispatched})
        return result

    def dispatch(self, action: Action, gpus: dict[str, state.Gpu], now: float | None = None) -> Dispatched | None:
        """Send one planned action through the dispatcher. `gpus`: the alive GPUs by id. None: skipped (its
        model is unknown to this tick's snapshot, or its GPU — for Stage/Unstage, every GPU of its node — is
        not alive); otherwise the dispatcher's answer (`sent` False: an action on it is already in flight)."""
        assert self.reader is not None, "dispatch runs after a snapshot (a tick as leader)"
        ref = self.reader.refs.get(action.model)
        if ref is None:
            return None
        numbers = dict(action.numbers)
        if isinstance(action, Stage | Unstage):
            on_node = sorted(gid for gid, g in gpus.items() if g.node == action.node and g.alive)
            if not on_node:
                return None
            gpu, where = gpus[on_node[0]], state.host_id(action.node)
            if isinstance(action, Stage):
                d = self.ctx.dispatcher.stage(ref.id, ref.version, gpu, actor="scheduler", reason=action.reason,
                                              numbers=numbers, kind=action.kind, value=action.value)
            else:
                d = self.ctx.dispatcher.unstage(ref.id, ref.version, gpu, actor="scheduler", reason=action.reason,
                                                numbers=numbers, kind=action.kind)
        else:
            g = gpus.get(action.gpu)
            if g is None:
                return None
            gpu, where = g, g.id
            if isinstance(action, Preload):
                d = self.ctx.dispatcher.preload(ref.id, ref.version, gpu, actor="scheduler", reason=action.reason,
                                                numbers=numbers, kind=action.kind)
            elif isinstance(action, Evict):
                d = self.ctx.dispatcher.evict(ref.id, ref.version, gpu, actor="scheduler", reason=action.reason,
                                              numbers=numbers, kind=action.kind)
                if d.sent:
                    self.reader.note_eviction(action.model, time.time() if now is None else now)
            else:
                return None
        if d.sent:
            log.info("%s %s on %s (%s): %s", type(action).__name__.lower(), action.model, where, action.kind,
                     action.reason)
        return d

    def safe_tick(self) -> None:
        from web.metrics import SCHEDULER_TICK

        try:
            res = self.tick()
            if res.leader:
                SCHEDULER_TICK.observe(res.seconds)
                if res.dispatched:
                    log.info("tick: %d actions, %d dispatched in %.3f s", res.actions, res.dispatched,
                             res.seconds)
        except redis.RedisError as exc:
            # Redis down or restarted: keep ticking; leadership and history are rebuilt when it is back.
            log.warning("tick skipped, Redis unavailable: %s", exc)
            self.leadership.is_leader = False
            self.reader = None
        except Exception:
            log.exception("tick failed")

    def run(self) -> None:
        from apscheduler.schedulers.blocking import BlockingScheduler

        sched = BlockingScheduler()
        sched.add_job(self.safe_tick, "interval", seconds=self.ctx.settings.tick_seconds, max_instances=1,
                      coalesce=True)
        log.info("scheduler %s ticking every %.1f s (leader lock TTL %.0f s)", self.ident,
                 self.ctx.settings.tick_seconds, self.ctx.settings.leader_ttl)
        self.safe_tick()
        try:
            sched.start()
        finally:
            self.leadership.release()
