"""The live scheduler: every tick, snapshot → `plan` → dispatch, while it holds the leader lock.

    tick:  leadership.ensure()            one planner at a time (redis-py Lock with a TTL)
           snapshot = reader.read(...)    I/O: catalog, traffic, fleet, replicas, intents
           actions = plan(snapshot, now)  pure
           dispatcher.preload/evict(...)  claims an intent per (model, gpu), sends the task by name

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

from prewarm import events, keys
from prewarm.context import Context
from scheduler.leader import Leadership
from scheduler.policy import Evict, PolicyConfig, PolicyState, Preload, plan
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
            ref = self.reader.refs.get(action.model)
            gpu = gpus.get(action.gpu)
            if ref is None or gpu is None:
                continue
            try:
                if isinstance(action, Preload):
                    d = self.ctx.dispatcher.preload(ref.id, ref.version, gpu, actor="scheduler",
                                                    reason=action.reason, numbers=dict(action.numbers),
                                                    kind=action.kind)
                elif isinstance(action, Evict):
                    d = self.ctx.dispatcher.evict(ref.id, ref.version, gpu, actor="scheduler",
                                                  reason=action.reason, numbers=dict(action.numbers),
                                                  kind=action.kind)
                    if d.sent:
                        self.reader.note_eviction(action.model, now)
                else:
                    continue
                result.dispatched += int(d.sent)
                if d.sent:
                    log.info("%s %s on %s (%s): %s", type(action).__name__.lower(), action.model, action.gpu,
                             action.kind, action.reason)
            except Exception as exc:  # one failed send must not lose the rest of the plan
                log.exception("dispatch of %s failed", action)
                result.errors.append(str(exc))
        result.seconds = time.perf_counter() - started
        self.ctx.r.hset(keys.SCHEDULER_STATUS, mapping={
            "leader": self.ident, "last_tick": f"{now:.3f}", "tick_seconds": f"{result.seconds:.4f}",
            "actions": result.actions, "dispatched": result.dispatched})
        return result

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
