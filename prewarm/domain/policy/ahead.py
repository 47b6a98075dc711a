"""Are loads ahead worth it on this traffic? A record of their real outcomes, which gates them
(issue 26, item 2: "whether loads ahead are worth their bandwidth on this traffic").

A load ahead (speculative, partner) bets that the model it loads, S, is asked for before the replicas
it evicts, V. That is Belady's comparison (Belady, "A study of replacement algorithms for a virtual-storage
computer", IBM Systems Journal 1966: the better of two residents to keep is the one requested sooner):
- S requested before any of V: the bet won; it saved S's reload, `Values.cost(S)` cold requests;
- one of V requested first: the bet lost; that victim comes back cold, `Values.cost(V)` cold requests
  that staying put would not have had.
As LeCaR (Vietri et al., HotStorage 2018) charges an expert the misses its own evictions cause, this
record charges loads ahead with theirs, on the real fleet (its GPUs, sizes and links), not on ghosts:
the pooled ghosts of experts.py were measured not to carry over to a fleet of several GPUs.

Both outcomes are decayed with the no-regret layer's half-life (`PolicyConfig.expert_halflife_s`), so
the record follows traffic that changes. Loads ahead go on while the decayed wins are at least
`PolicyConfig.prefetch_margin` times the decayed losses (the bar plan() sets each load ahead's expected value
against its victims', now held against what they did; with no record yet they go on). Measured, a bar of 1
(a bet that merely pays for itself) left ServeGen 24 h × 16 at 54,561 cold starts, the margin's 2 at 53,507,
the Azure points unchanged either way. While they are held back,
the loads ahead the policy would have made are still recorded as *shadows* (their S and V, nothing
loaded) and judged the same way, so the record can open the gate again when the traffic turns.
A load ahead evicted before S is asked for (`gone`) can no longer win: S's request finds no replica. Its bet
is then settled by its victims alone. Left open on S, it scored a win for a load that served nothing: on ServeGen
72 h × 16 those wins held the gate open for loads ahead of which a third served a request, and the point had
+1.2 % cold starts (143,565 against 141,043 with them closed).
A bet nobody settles within `expert_halflife_s` (neither S nor any V asked for) is dropped, charged only
its link time: every bet, settled or not, is charged the requests its link time holds up (the load's time
× `Values.link_rate`, the requests per second waiting on a link), since on a link-bound fleet a load ahead
slows the demand loads beside it, a cost the duel with its victims does not see. It is charged when the
bet settles, with its outcome: charged at the bet, a burst of bets would close the gate before any could
be won (measured: Azure 500 × 8 seed 1 lost 2 % of its cold starts so).

Cost: O(models with new requests) per plan() call, plus the bets made. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .history import TrafficHistory, made_before, new_requests

MIN_SCORED = 4.0  # decayed cold requests on record before the gate may close (a fresh record decides nothing)


class Bet:
    __slots__ = ("target", "victims", "since", "shadow", "ready", "link")

    def __init__(self, target: str, victims: tuple[str, ...], since: float, shadow: bool, ready: float,
                 link: float) -> None:
        self.target = target
        self.victims = victims
        self.since = since
        self.shadow = shadow
        self.ready = ready  # when the load ahead would be ready: a request before it finds it loading
        self.link = link  # the requests its link time holds up, charged when the bet settles


def _made(b: Bet) -> float:
    return b.since


class AheadRecord:
    """Kept in PolicyState.ahead from call to call (see the module docstring)."""

    def __init__(self) -> None:
        self.reset(0)

    def reset(self, traffic_id: int) -> None:
        self.traffic_id = traffic_id
        self.seq = -1
        self.seen: dict[str, float] = {}  # model -> requests fed so far (TrafficHistory.total)
        self.bets: dict[int, Bet] = {}
        self.by_model: dict[str, set[int]] = {}  # model -> open bets naming it (as target or victim)
        self.pending: dict[str, int] = {}  # target -> its open bet (one per target)
        self.next_id = 0
        self.won = 0.0  # decayed cold requests saved
        self.lost = 0.0  # decayed cold requests caused
        self.last_now = -math.inf
        self.settled = 0  # bets scored, for the reason text
        self.won_total = 0.0  # undecayed, for reports
        self.lost_total = 0.0
        self.shadow_total = 0  # bets made as shadows (the gate held loads ahead back)
        self.margin = 1.0  # PolicyConfig.prefetch_margin, set by feed()
        self.calls = 0  # plan() calls fed, and of them those with loads ahead held back
        self.held_calls = 0

    # ---- the gate ------------------------------------------------------------------------
    def open(self) -> bool:
        """Loads ahead go on: no record yet, or what they saved clears what they cost by the margin plan()
        asks of each one's expected value (PolicyConfig.prefetch_margin): the realised record is held to
        the bar the guesses were."""
        return self.won + self.lost < MIN_SCORED or self.won >= self.margin * self.lost

    def why(self) -> str:
        state = "on" if self.open() else "held back"
        return (f"loads ahead {state}: on this traffic they saved {self.won:.1f} and cost {self.lost:.1f} "
                f"cold requests (decayed, {self.settled} bets settled)")

    def describe(self) -> dict[str, object]:
        return {"open": self.open(), "won": round(self.won, 2), "lost": round(self.lost, 2),
                "settled": self.settled, "open_bets": len(self.bets), "won_total": round(self.won_total, 1),
                "lost_total": round(self.lost_total, 1), "shadow_bets": self.shadow_total,
                "held_calls": self.held_calls, "calls": self.calls}

    # ---- bets ----------------------------------------------------------------------------
    def wants(self, target: str) -> bool:
        """No open bet on this target yet (a shadow repeated every tick would count one bet many times)."""
        return target not in self.pending

    def bet(self, target: str, victims: tuple[str, ...], now: float, shadow: bool, ready: float,
            link: float = 0.0) -> None:
        old = self.pending.get(target)
        if old is not None:
            self._close(old)
        i = self.next_id
        self.next_id += 1
        b = Bet(target, victims, now, shadow, ready, link)
        self.shadow_total += shadow
        self.bets[i] = b
        self.pending[target] = i
        for m in (target, *victims):
            self.by_model.setdefault(m, set()).add(i)

    def _close(self, i: int) -> None:
        b = self.bets.pop(i)
        if self.pending.get(b.target) == i:
            del self.pending[b.target]
        for m in (b.target, *b.victims):
            self._unlink(i, m)

    def _unlink(self, i: int, m: str) -> None:
        """Bet i no longer settles on requests for m."""
        s = self.by_model.get(m)
        if s is not None:
            s.discard(i)
            if not s:
                del self.by_model[m]

    def gone(self, target: str) -> None:
        """The replica a load ahead made of `target` was evicted before `target` was asked for: the bet can no
        longer be won (a request now finds no replica), only lost by a victim's return or dropped at its horizon.
        Left open on `target`, a later request would score a win for a load that served nothing."""
        i = self.pending.get(target)
        if i is None or self.bets[i].shadow:
            return
        del self.pending[target]
        self._unlink(i, target)
        self.bets[i].target = ""  # settled by its victims alone; _close finds no target to unlink

    def _lose(self, c: float) -> None:
        self.lost += c
        self.lost_total += c

    # ---- feeding -------------------------------------------------------------------------
    def feed(self, tr: TrafficHistory, now: float, halflife_s: float, cost: Callable[[str], float],
             margin: float = 1.0) -> None:
        """Settle the open bets by the requests since the last call (each model's new requests at its
        last arrival, in time order). `cost(model)`: cold requests one reload of it costs; `margin`: how
        many times what they cost loads ahead must have saved to go on."""
        self.margin = margin
        if self.traffic_id != id(tr):
            self.reset(id(tr))
        if now > self.last_now > -math.inf:
            d = 0.5 ** ((now - self.last_now) / halflife_s)
            self.won *= d
            self.lost *= d
        self.last_now = max(self.last_now, now)
        by_model = self.by_model
        for t, m, _n in new_requests(tr, self.seq, self.seen):
            for i in sorted(by_model.get(m, ())):
                b = self.bets[i]
                if t < b.since:
                    continue  # a request from before the bet says nothing of it
                # the link time's cost is charged with the outcome, not before it: charged at the bet,
                # a burst of bets would close the gate before any of them could be won
                self._lose(b.link)
                if m != b.target:
                    self._lose(cost(m))
                elif t >= b.ready:  # asked for while it loads, it is cold all the same: neither won nor lost
                    c = cost(m)
                    self.won += c
                    self.won_total += c
                self.settled += 1
                self._close(i)
        self.seq = tr.seq
        horizon = now - halflife_s
        for i in made_before(self.bets, _made, horizon):  # in the order they were made
            self._lose(self.bets[i].link)  # its link time was spent all the same
            self._close(i)
        self.calls += 1
        self.held_calls += not self.open()
