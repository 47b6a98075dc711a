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

A change of leader without a failover can lose a task too: a leader killed between claiming an intent and
publishing its task leaves an intent that would block that model on that GPU for the intent TTL. So a
scheduler that takes the lead runs the same reconcile once, `LOST_TASK_GRACE_S` after, over the intents
claimed before it led (their publish, milliseconds after the claim, is long done or never happens).
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
from prewarm.domain.action_kinds import DEMAND
from prewarm.domain.policy import Action, Evict, Preload

log = logging.getLogger(__name__)

# Marks a failover's event as recorded (HSET only when it names another failover): one event per failover.
_CLAIM = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
_claim = redis.commands.core.Script(None, _CLAIM.encode())

# After taking the lead, how old the intents claimed before must be to be judged (a claim's task is published
# within milliseconds of the claim; this leaves a loaded machine ample time).
LOST_TASK_GRACE_S = 2.0
_UNACKED = "unacked"  # kombu's Redis transport: delivered, not yet acknowledged (QoS.unacked_key)


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
        self._led_at: float | None = None  # this term began then; its intents-left-behind check is still due

    def took_lead(self, now: float) -> None:
        """A term as leader begins: check the intents the last leader left, once they are old enough."""
        self._led_at = now

    def left_behind(self, fleet: state.Fleet, now: float) -> list[str] | None:
        """Once per term, LOST_TASK_GRACE_S after it began: send again the preloads an earlier leader claimed
        and never sent (see the module docstring). None when not due now; else what was done."""
        if self._led_at is None or now < self._led_at + LOST_TASK_GRACE_S:
            return None
        led_at, self._led_at = self._led_at, None
        done = resend_lost(self.ctx, fleet, "after the last leader stopped before sending its task",
                           claimed_before=led_at)
        if done:
            log.warning("took the lead: %s", "; ".join(done))
            events.record(self.ctx.r, "leader", "scheduler",
                          reason=f"scheduler {self.ident} took the lead; {len(done)} action(s) an earlier leader "
                                 f"claimed and never sent: {'; '.join(done)}",
                          numbers={"resent": done, "scheduler": self.ident},
                          maxlen=self.ctx.settings.event_log_max)
        return done

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
        done = resend_lost(self.ctx, fleet, "after the Redis failover lost its task")
        events.record(r, "failover", "scheduler", reason=f"after the failover hold: {len(done)} action(s) whose "
                      f"task was lost {'handled: ' + '; '.join(done) if done else '(none)'}",
                      numbers={"failover_at": self.s.at, "resent": done, "scheduler": self.ident,
                               "fleet_whole_seconds": None if self.s.whole_at is None
                               else max(0.0, self.s.whole_at - self.s.at)},
                      maxlen=self.ctx.settings.event_log_max)
        if done:
            log.warning("after the failover: %s", "; ".join(done))
        return done


def resend_lost(ctx: Context, fleet: state.Fleet, why: str, *,
                claimed_before: float | None = None) -> list[str]:
    """Release the preload and evict intents in flight whose task is lost, and send each lost preload again
    under a new intent (a late copy of the old task is then superseded and dropped by its worker); what was
    done, in words. Lost: its task neither waits in its GPU's queue (or in the broker's delivered-but-unacked
    set) nor runs on the worker (for a preload no pending/loading/warming/ready replica there, for an evict
    none evicting). `claimed_before`: only intents claimed before then. `why`: how they were lost, in the
    reason of each preload sent again ("sent again {why} (...)")."""
    r = ctx.r
    gpus = {g.id: g for g in fleet.alive()}
    flight = [i for i in state.read_intents(r) if i.action in ("preload", "evict")
              and (claimed_before is None or i.created_at < claimed_before)]
    if not flight:
        return []
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
        order = order_preload(i.model, i.version, g, actor="scheduler", kind=i.kind or DEMAND,
                              reason=f"sent again {why} ({i.actor}: {i.reason})",
                              numbers={"resent": True, "lost_task": i.task_id, "lost_intent": i.id},
                              result=i.actor != "scheduler")
        [answer] = ctx.dispatcher.send_many([order])
        sent = not isinstance(answer, Exception) and answer.sent
        done.append(f"{'sent again' if sent else 'released'} the preload of {i.model}@{i.version} on {i.gpu}")
    return done


def _queued_task_ids(r: redis.Redis, queues: Iterable[str]) -> set[str]:
    """The task ids of the messages waiting in these Celery queues (kombu's Redis lists) or delivered to a
    worker and not acknowledged yet (kombu's `unacked` hash: a worker holds them)."""
    ids: set[str] = set()
    for q in queues:
        for raw in r.lrange(q, 0, -1):
            try:
                ids.add(str(json.loads(raw)["headers"]["id"]))
            except (ValueError, KeyError, TypeError):
                continue
    for raw in r.hvals(_UNACKED):
        try:
            ids.add(str(json.loads(raw)[0]["headers"]["id"]))  # [message, exchange, routing key]
        except (ValueError, KeyError, TypeError, IndexError):
            continue
    return ids

