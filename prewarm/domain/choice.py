"""The one interface the live scheduler calls for every policy — prewarm's plan and each baseline's rule —
and the choice among them by name (PREWARM_POLICY, `prewarm.domain.policy_names`).

    policy = make_policy(name, config)                    # once per term as leader (fresh state)
    actions = policy.decide(snapshot, now, arrivals)      # every tick: snapshot -> actions -> dispatch

`arrivals`: the requests the traffic store reported since the previous call, (model, second, count), the
same ones fed into `snapshot.traffic`. prewarm reads them from the history; a baseline replays them as
its per-request events (`baselines.live`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from prewarm.domain.policy_names import DEFAULT, check

from .baselines import RULES
from .baselines.live import Arrival, BaselinePolicy
from .policy.adapters import plan_with_adapters
from .policy.planner import PolicyState
from .policy.types import Action, PolicyConfig, Snapshot
from .whole import HOME, ORDER_OF, WholeExperts


class Policy(Protocol):
    name: str

    def decide(self, snap: Snapshot, now: float, arrivals: Sequence[Arrival] = ()) -> list[Action]: ...

    def wakes_on_ready(self) -> bool:
        """Whether a load turning ready while requests wait should wake the leader to plan at once (an
        event-driven baseline rule), or can wait for the next tick (prewarm's plan)."""
        ...


class PrewarmPolicy:
    """prewarm's own plan(), with its cache kept between ticks (LoRA adapters: plan_with_adapters, issue 29),
    or the whole baseline whose shadow fleet leads the real one (whole.py; PolicyConfig.whole_experts)."""

    name = DEFAULT

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.state = PolicyState()
        self.whole = WholeExperts()

    def wakes_on_ready(self) -> bool:
        # prewarm's plan queues its loads on the GPUs and ticks; a whole expert's rule is event-driven: without the
        # wake-up its stalled misses waited up to a tick after each load (on/off x 4: 8,779 cold starts where the
        # same rule in the simulator had 8,628)
        # (prewarm's plan too while a demand load waits for a busy link: PolicyConfig.link_wait)
        return self.whole.leader != HOME or bool(self.state.link_waits)

    def decide(self, snap: Snapshot, now: float, arrivals: Sequence[Arrival] = ()) -> list[Action]:
        actions = self.whole.decide(snap, now, arrivals)
        if actions is not None:
            return actions
        ex = self.state.experts
        verdict = self.whole.long_verdict(ex.adopted_order(), ex.on_trial()) \
            if snap.config.no_regret and snap.config.whole_experts else None
        if verdict is not None:  # sparse traffic: a whole expert ahead on the long record lends the plan its order
            name, take = verdict
            if take:
                self.whole.took(name if ex.adopt(ORDER_OF[name], now) else None)
            else:
                ex.give_back(ORDER_OF[name], now)
                self.whole.took(None)
        return plan_with_adapters(snap, now, self.state)


def make_policy(name: str, config: PolicyConfig) -> Policy:
    """A fresh policy named as PREWARM_POLICY names it (ValueError lists the names)."""
    check(name)
    if name == DEFAULT:
        return PrewarmPolicy(config)
    return BaselinePolicy(name, RULES[name](), config)

