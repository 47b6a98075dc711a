"""What the scheduler does after a Redis failover (prewarm.failover notices it; this module acts on it).

Replication is asynchronous, so the promoted replica may lack the last writes: intents, task messages,
heartbeats, the leader lock. For one heartbeat TTL after the failover (the window in which every live
worker re-announces its GPUs and replicas, PREWARM_HEARTBEAT_TTL) the leader:

- evicts nothing: a fleet view the failover thinned is no ground for freeing memory;
- plans no preload while a GPU it saw before the failover has not re-announced (it could put a second
  replica of a model on another GPU); once the fleet is whole again it plans as usual;
- at the end of the window, reconciles the preload and evict intents in flight (one leader per failover):
  one whose task is neither in its GPU's queue nor running on the worker (for a preload no pending/loading/
  warming/ready replica there, for an evict none evicting) was lost with the old master (its message never
  replicated, or the worker's reconnect dropped it unacknowledged). A lost preload's intent is released and
  the same preload sent again under a new intent (a late copy of the old task is then superseded and
  dropped by the worker). A lost evict's intent is only released: the replica is still there for the
  policy (or the operator) to decide on again, and a new evict would take over a preload sent meanwhile.
  So is a preload's for a GPU that is gone: the policy plans that model again on its next tick.

Each failover is one `failover` event (the first leader to see it records it), and another when the
reconcile has run, naming what was sent again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import redis

from prewarm import events, failover, keys, state
from prewarm.context import Context
from prewarm.dispatch import order_preload
from prewarm.domain import states as rs
from prewarm.domain.policy import Action, Evict, Preload

log = logging.getLogger(__name__)

# Marks a failover's event as recorded (HSET only when it names another failover): one event per failover.
_CLAIM = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
_claim = redis.commands.core.Script(None, _CLAIM.encode())


@dataclass
class FailoverState:
    """What one scheduler process knows of the last failover."""

    at: float | None = None  # failover_at of the last failover this process acted on
    hold_until: float = 0.0
    gpus_before: frozenset[str] = frozenset()  # the alive GPUs of the last tick before it
    reconciled: bool = True
    whole_at: float | None = None  # when every GPU seen before re-announced
    held: list[str] = field(default_factory=list)  # this tick's held actions, for the log


class FailoverGuard:
    def __init__(self, ctx: Context, ident: str) -> None:
        self.ctx = ctx
        self.ident = ident
        self.s = FailoverState()
        self._known: float | None | bool = False  # False: not observed yet (the first look sets it)
        self._last_gpus: frozenset[str] = frozenset()

    def observe(self, now: float) -> failover.Epoch | None:
        """Look at the master's run id; the epoch when this process sees a failover it has not acted on."""
        e = failover.observe(self.ctx.r, now)
        first = self._known is False
        changed = not first and e.failover_at is not None and e.failover_at != self._known
        self._known = e.failover_at
        return e if changed else None

    def begin(self, e: failover.Epoch, now: float) -> None:
        """A failover seen as leader: start the hold and record it (once, whoever sees it first)."""
        assert e.failover_at is not None
        ttl = self.ctx.settings.heartbeat_ttl
        self.s = FailoverState(at=e.failover_at, hold_until=e.failover_at + ttl, gpus_before=self._last_gpus,
                               reconciled=False)
        log.warning("Redis master changed (run id %s -> %s): holding evictions for %.1f s while workers "
                    "re-announce", e.previous[:8], e.run_id[:8], ttl)
        if _claim(keys=[keys.REDIS_EPOCH], args=["recorded", f"{e.failover_at:.3f}"], client=self.ctx.r):
            events.record(self.ctx.r, "failover", "scheduler",
                          reason=f"the Redis master changed (a Sentinel failover or a restart; run id "
                                 f"{e.previous[:8]} -> {e.run_id[:8]}): evictions held for one heartbeat TTL "
                                 f"({ttl:g} s) while workers re-announce; preloads whose tasks were lost are sent "
                                 "again after it",
                          numbers={"run_id": e.run_id, "previous": e.previous, "failover_at": e.failover_at,
                                   "hold_seconds": ttl, "scheduler": self.ident,
                                   "gpus_before": sorted(self.s.gpus_before)},
                          maxlen=self.ctx.settings.event_log_max)

    def holding(self, now: float) -> bool:
        return now < self.s.hold_until

    def filter(self, actions: Sequence[Action], fleet: state.Fleet, now: float) -> list[Action]:
        """The plan with what the hold keeps back; also notes this tick's fleet for the next failover."""
        alive = frozenset(g.id for g in fleet.alive())
        self._last_gpus = alive
        self.s.held = []
        if self.s.at is None:
            return list(actions)
        whole = self.s.gpus_before <= alive
        if whole and self.s.whole_at is None:
            self.s.whole_at = now
            log.info("fleet view whole again %.1f s after the failover", max(0.0, now - self.s.at))
        if not self.holding(now):
            return list(actions)
        out: list[Action] = []
        for a in actions:
            if isinstance(a, Evict) or (isinstance(a, Preload) and not whole):
                self.s.held.append(f"{type(a).__name__.lower()} {a.model} on {a.gpu}")
            else:
                out.append(a)
        if self.s.held:
            log.info("failover hold: kept back %s", ", ".join(self.s.held))
        return out

    def reconcile(self, fleet: state.Fleet, now: float) -> list[str] | None:
        """Once the hold is over: send again the preloads whose tasks were lost (see the module docstring).
        None when there is nothing to do now; else what was sent again or released."""
        if self.s.reconciled or self.s.at is None or self.holding(now):
            return None
        self.s.reconciled = True
        r = self.ctx.r
        if not _claim(keys=[keys.REDIS_EPOCH], args=["reconciled", f"{self.s.at:.3f}"], client=r):
            return None  # another leader (the lead changed during the hold) has reconciled this failover
        gpus = {g.id: g for g in fleet.alive()}
        flight = [i for i in state.read_intents(r) if i.action in ("preload", "evict")]
        queued = _queued_task_ids(r, {gpus[i.gpu].queue for i in flight if i.gpu in gpus})
        # the replicas as of now, not as of the tick's snapshot: a worker may have finished a task since
        states = {(x.model, x.version, x.gpu): x.state for x in state.read_fleet(r).replicas()}
        done: list[str] = []
        for i in flight:
            now_state = states.get((i.model, i.version, i.gpu))
            if i.task_id and i.task_id in queued:
                continue  # still waiting in its queue
            if i.action == "preload" and now_state in rs.HOLDING:
                continue  # running or done
            if i.action == "evict" and now_state == rs.EVICTING:
                continue  # running
            if not state.release_intent(r, i.model, i.gpu, i.id):
                continue  # settled meanwhile
            g = gpus.get(i.gpu)
            if i.action == "evict" or g is None:
                # An evict is not sent again: its replica is still there for the policy (or the operator) to
                # decide on again, and a new evict would take over any preload of it sent meanwhile.
                done.append(f"released the {i.action} of {i.model}@{i.version} on {i.gpu}"
                            f"{' (GPU gone)' if g is None else ''}")
                continue
            order = order_preload(i.model, i.version, g, actor="scheduler", kind=i.kind or "demand",
                                  reason=f"sent again after the Redis failover lost its task ({i.actor}: {i.reason})",
                                  numbers={"resent": True, "lost_task": i.task_id, "lost_intent": i.id},
                                  result=i.actor != "scheduler")
            [answer] = self.ctx.dispatcher.send_many([order])
            sent = not isinstance(answer, Exception) and answer.sent
            done.append(f"{'sent again' if sent else 'released'} the preload of {i.model}@{i.version} on {i.gpu}")
        events.record(r, "failover", "scheduler", reason=f"after the failover hold: {len(done)} action(s) whose "
                      f"task was lost {'handled: ' + '; '.join(done) if done else '(none)'}",
                      numbers={"failover_at": self.s.at, "resent": done, "scheduler": self.ident,
                               "fleet_whole_seconds": None if self.s.whole_at is None
                               else max(0.0, self.s.whole_at - self.s.at)},
                      maxlen=self.ctx.settings.event_log_max)
        if done:
            log.warning("after the failover: %s", "; ".join(done))
        return done


def _queued_task_ids(r: redis.Redis, queues: Iterable[str]) -> set[str]:
    """The task ids of the messages waiting in these Celery queues (kombu's Redis lists)."""
    ids: set[str] = set()
    for q in queues:
        for raw in r.lrange(q, 0, -1):
            try:
                ids.add(str(json.loads(raw)["headers"]["id"]))
            except (ValueError, KeyError, TypeError):
                continue
    return ids

