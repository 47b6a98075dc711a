"""Which expert's eviction order leads, judged on the real fleet (issue 26, item 2): at every eviction plan()
makes to place a load, each other expert's victims on that GPU are compared with the ones taken.

The comparison is Belady's (Belady, IBM Systems Journal 1966: of two residents, keep the one requested
sooner). At an eviction the leading order took A and expert X would have taken B (its own order over the same
GPU's victims, as many bytes); A and B differ in A \\ B and B \\ A. The first of them requested afterwards
settles the duel:
- one of A \\ B (a victim taken comes back): X's order would have kept it: X *won* that model's reload cost;
- one of B \\ A (X's victim, which stayed, is asked for): X's order would have lost it: X *lost* that cost;
- neither within the record's half-life: dropped, nothing charged.
This is LeCaR's regret (Vietri et al., HotStorage 2018: an expert is charged the misses its evictions
cause) measured on the real fleet's GPUs, sizes and eviction moments instead of on ghost caches: the pooled
ghosts of experts.py were measured to lead the wrong way on a fleet of several GPUs (ServeGen 72 h × 16:
greedy-dual led them by 18 % and following it cost +15 % cold starts), since a ghost pool has no GPUs, no
links and no loads ahead. One step of divergence is judged, not the fleet the other order would have grown:
the approximation LeCaR and CACHEUS make too.

Both sums are decayed with `PolicyConfig.expert_halflife_s`. The incumbent (prewarm's own value order at
first) hands the lead to the expert whose record clears `PolicyConfig.prefetch_margin` times what it lost
(the bar plan() sets each load ahead against its victims) once the record holds MIN_SCORED cold requests;
a new leader starts a new record, so the old one is judged against it the same way and takes the lead back
when its order would have done better.

A one-step duel can mislead: the other order, once it leads, grows another fleet (a hand-built scan
trace: LRU wins the duels against prewarm's order, then leading it has 14 % more cold starts). So a new lead
is a trial, judged by what the real evictions cost: the reload cost of the victims that come back within the
half-life, per request served (per eviction would favour an order that evicts often and cheaply). The two
orders take turns in windows of TRIAL_WINDOW_HALFLIVES half-lives on the same traffic (an A/B test in time
slices): each side is charged the returns of the victims it took, whichever side leads when they come back,
per request served while it led. Once each side has led TRIAL_WINDOWS windows and made TRIAL_EVICTIONS
evictions, the candidate keeps the lead if its victims cost no more per request; else the lead goes back and
the candidate sits out BAN_HALFLIVES half-lives. Judging the trial against the incumbent's record from
before the switch, as first built, compared two periods: on Azure 1,350 × 8 seed 1 the switch came in the
first hour, the incumbent's record was the fleet's warm-up, greedy-dual's trial passed, and the fleet had
13,554 cold starts against 9,521 in the first 6 h (+42 %). In turns the same trial fails and goes back
(9,629: +0.8 %, the price of the trial's windows).

A trial is a bet on the worse order while it runs, and its windows are a sample: so a candidate whose victims
cost more than the incumbent's after TRIAL_FAIL_AFTER windows each fails at once, one passes only after
TRIAL_WINDOWS windows each and at least TRIAL_MARGIN cheaper per request (and, below, with a share of its
requests cold TRIAL_MARGIN lower), and each further failure doubles the candidate's wait. Before (3 windows,
no margin, and greedy-dual ranking real victims by its ghost's keys): ServeGen 72 h × 16 seed 0 had +30 % cold
starts with the layer on.

The victims' returns are what an order decides, not all it changes: on a saturated fleet most cold requests
wait for loads in flight, and an order can take victims that come back less while the fleet it grows serves
more requests cold. ServeGen 72 h × 8 seed 0: greedy-dual's victims cost 17 % less per request in its trial,
so it passed, while 0.83 of the requests in its windows were cold against 0.77 in prewarm's, and leading it
cost +5.2 % cold starts (517,700 against 492,191). So each side's windows also count the requests served
cold (no ready replica in the snapshot when plan() takes them in), and the candidate must not serve a larger
share of its requests cold: it fails at once if it does after TRIAL_FAIL_AFTER windows each (494,133 on that
point). To pass at the end its share must also be lower by TRIAL_MARGIN, as its victims' cost must: a share
that is only as good is a tie, and the turns' fleets carry over from one window to the next. On a saturated
fleet nearly every request is cold in both sides' windows, and a tie there passed a trial the hours after
disproved (ServeGen 72 h × 8 seed 0 with the fill taking all free memory: greedy-dual passed on 0.961 of its
requests cold against prewarm's 0.980 and 31 % cheaper victims, led from hour 35 to the end and had 516,157
cold starts, +4.6 %; with the margin on both, 493,094). See docs/simulation.md.

A pass is not the end of the judging. Each turn of a trial starts from the fleet the other order left, so an
order can pass by living off the other's fleet and then do worse on its own. So the whole course is judged too:
the share of requests served cold since the pass (decayed over COURSE_HALFLIVES half-lives), against the home
order's share while it led. More than COURSE_MARGIN above it, once the leader has led COURSE_MIN_HALFLIVES, the lead
goes home and the order sits out COURSE_BAN_HALFLIVES half-lives, doubled at each further failure. A bad course
then costs at most a few hours at each of a logarithmic number of tries. On the 14-day stream view, with the
request count still halving (history.py), greedy-dual passed at hour 17.6 and led its fleet to 4.8× the cold
starts of prewarm's own order. Counted right, greedy-dual passes there only on four GPUs, where its course
stays within the margin (1,741 cold starts against 1,738 for prewarm's own order).

Cost: O(models with new requests) per plan() call (their open duels), plus one sort of a GPU's victims per
expert at each eviction plan() makes to place a load. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable

from .history import made_before

MIN_SCORED = 8.0  # decayed cold requests on record before the lead may change (a fresh record decides nothing)
TRIAL_EVICTIONS = 16.0  # decayed evictions each side of a trial makes before it is judged
BAN_HALFLIVES = 4.0  # an expert whose trial failed sits out this many half-lives, doubled at each further failure
TRIAL_WINDOW_HALFLIVES = 1.0 / 12.0  # a trial alternates the two orders in windows this long (5 min at 1 h)
TRIAL_WINDOWS = 12  # ... and is judged once each order has led this many windows (and has its evictions)
# ... but a candidate whose victims cost more than the incumbent's after this many windows each fails at once:
# a trial is a bet on the worse order while it runs (Azure 1,350 × 8 seed 0, 24 h: two 2-hour trials of
# greedy-dual cost +4 % cold starts; failing at the first windows, +0.01 %)
TRIAL_FAIL_AFTER = 1
# ... and passes when its victims cost at most (1 - this) times the incumbent's per request, and it served at most
# (1 - this) times the incumbent's share of its requests cold: a trial's windows are a sample of the traffic, and
# a tie on either is no reason to leave the order that leads
TRIAL_MARGIN = 0.1
# The whole-course guard (see the module docstring): a leader that passed its trial is judged on the share of
# requests its fleet serves cold, decayed with this many half-lives (6 h at 1 h) ...
COURSE_HALFLIVES = 6.0
COURSE_MIN_HALFLIVES = 2.0  # ... once it has led this long
COURSE_MARGIN = 0.25  # ... against the home order's share while it led; above it by this much, the lead goes home
COURSE_BAN_HALFLIVES = 24.0  # ... and the order sits out this long, doubled at each further failure


def _opened(d: Duel) -> float:
    return d.since


def _taken(e: tuple[float, str]) -> float:
    return e[0]


class Trial:
    """A new lead on trial: it and the order it would replace take turns in windows of the same traffic; each
    side's evictions are charged the returns of its own victims, per request served while it led, and the
    requests it served cold are counted."""

    __slots__ = ("before", "candidate", "window_end", "windows", "evictions", "returned", "requests", "cold")

    def __init__(self, before: str, candidate: str, window_end: float) -> None:
        self.before = before
        self.candidate = candidate
        self.window_end = window_end
        self.windows = {before: 0, candidate: 0}
        self.evictions = {before: 0.0, candidate: 0.0}
        self.returned = {before: 0.0, candidate: 0.0}
        self.requests = {before: 0.0, candidate: 0.0}
        self.cold = {before: 0.0, candidate: 0.0}  # requests served cold while it led

    def decay(self, d: float) -> None:
        for n in (self.before, self.candidate):
            self.evictions[n] *= d
            self.returned[n] *= d
            self.requests[n] *= d
            self.cold[n] *= d

    def per_request(self, n: str) -> float:
        q = self.requests[n]
        return self.returned[n] / q if q > 0 else 0.0

    def cold_share(self, n: str) -> float:
        q = self.requests[n]
        return self.cold[n] / q if q > 0 else 0.0

    def worse(self) -> bool:
        """The candidate's victims cost more per request, or more of the requests it served were cold."""
        c, b = self.candidate, self.before
        return self.per_request(c) > self.per_request(b) or self.cold_share(c) > self.cold_share(b)

    def ready(self, windows: float) -> bool:
        """Each side has led `windows` windows and made TRIAL_EVICTIONS evictions."""
        return all(self.windows[n] >= windows and self.evictions[n] >= TRIAL_EVICTIONS
                   for n in (self.before, self.candidate))

    def done(self) -> bool:
        return self.ready(TRIAL_WINDOWS)

    def losing(self) -> bool:
        """A candidate whose victims already cost more, after TRIAL_FAIL_AFTER windows each: it fails now."""
        return self.ready(TRIAL_FAIL_AFTER) and self.worse()


class Duel:
    __slots__ = ("expert", "taken", "spared", "since")

    def __init__(self, expert: str, taken: frozenset[str], spared: frozenset[str], since: float) -> None:
        self.expert = expert
        self.taken = taken  # evicted by the leader, kept by the expert's order
        self.spared = spared  # kept by the leader, evicted by the expert's order
        self.since = since


class Duels:
    """The record of duels between the leading eviction order and the others (see the module docstring)."""

    def __init__(self, names: tuple[str, ...], halflife: float = 3600.0) -> None:
        self.names = names
        self.halflife = halflife  # PolicyConfig.expert_halflife_s, set by the feed
        self.reset()

    def reset(self) -> None:
        self.leader = self.names[0]
        self.switches = 0
        self.reverts = 0
        self.banned: dict[str, float] = {}  # expert -> until when it may not lead (its trial failed)
        self.fails: dict[str, int] = {}  # expert -> trials it failed (each doubles its next wait)
        self.trial: Trial | None = None  # while a new lead is on trial
        # the whole course: requests and cold ones (decayed with COURSE_HALFLIVES) while the home order led,
        # and while the leader that passed its trial has led, since `lead_since`
        self.home = {"requests": 0.0, "cold": 0.0}
        self.course = {"requests": 0.0, "cold": 0.0}
        self.lead_since = 0.0
        # the leader was adopted on the whole experts' long record (sparse traffic, whole.py): that record judges its
        # course, not this one's (its cold requests come too seldom for COURSE_HALFLIVES)
        self.adopted = False
        self._new_record()

    def _new_record(self) -> None:
        self.won: dict[str, float] = {n: 0.0 for n in self.names}
        self.lost: dict[str, float] = {n: 0.0 for n in self.names}
        self.duels: dict[int, Duel] = {}
        self.by_model: dict[str, set[int]] = {}
        self.next_id = 0
        self.settled = 0
        # the leader's own evictions: victim -> (when, the order that took it), oldest first; what the returns
        # cost, and the requests served (decayed)
        self.evicted: dict[str, tuple[float, str]] = {}
        self.returned = 0.0
        self.requests = 0.0

    def decay(self, d: float) -> None:
        for n in self.names:
            self.won[n] *= d
            self.lost[n] *= d
        self.returned *= d
        self.requests *= d
        if self.trial is not None:
            self.trial.decay(d)
        dc = d ** (1.0 / COURSE_HALFLIVES)
        for rec in (self.home, self.course):
            rec["requests"] *= dc
            rec["cold"] *= dc

    def per_request(self) -> float:
        """What the leader's evictions cost, per request: the reloads of victims that came back (on trial:
        the ones it took in its windows, per request served in them)."""
        if self.trial is not None:
            return self.trial.per_request(self.leader)
        return self.returned / self.requests if self.requests > 0 else 0.0

    def took(self, victims: tuple[str, ...], now: float) -> None:
        """The leader's order took these victims now (a real eviction to place a load)."""
        for m in victims:
            self.evicted.pop(m, None)  # moved to the end: the dict stays in time order (expire stops early)
            self.evicted[m] = (now, self.leader)
        if self.trial is not None:
            self.trial.evictions[self.leader] += 1.0

    # ---- duels ---------------------------------------------------------------------------
    def open(self, expert: str, taken: tuple[str, ...], would_take: tuple[str, ...], now: float) -> None:
        """An eviction: the leader took `taken`; `expert`'s order would have taken `would_take`."""
        a, b = frozenset(taken), frozenset(would_take)
        if expert == self.leader or a == b:
            return
        i = self.next_id
        self.next_id += 1
        d = Duel(expert, a - b, b - a, now)
        self.duels[i] = d
        for m in d.taken | d.spared:
            self.by_model.setdefault(m, set()).add(i)

    def _close(self, i: int) -> None:
        d = self.duels.pop(i)
        for m in d.taken | d.spared:
            s = self.by_model.get(m)
            if s is not None:
                s.discard(i)
                if not s:
                    del self.by_model[m]

    def request(self, t: float, m: str, n: float, cost: Callable[[str], float], cold: bool = False) -> None:
        """`n` requests for `m`, the last at `t` (`cold`: `m` had no ready replica): they settle the open
        duels naming it (the first of their models asked for), and a victim of the leader's that came back is
        charged to its order."""
        self.requests += n
        trial = self.trial
        if trial is not None:
            trial.requests[self.leader] += n
            if cold:
                trial.cold[self.leader] += n
        else:
            rec = self.home if self.leader == self.names[0] else self.course
            rec["requests"] += n
            if cold:
                rec["cold"] += n
        got = self.evicted.pop(m, None)
        if got is not None and t >= got[0]:
            c = cost(m)
            self.returned += c
            if trial is not None and got[1] in trial.returned:
                trial.returned[got[1]] += c  # charged to the order that took it, whichever leads now
        ids = self.by_model.get(m)
        if not ids:
            return
        for i in sorted(ids):
            d = self.duels[i]
            if t < d.since:
                continue  # a request from before the eviction says nothing of it
            if m in d.taken:
                self.won[d.expert] += cost(m)
            else:
                self.lost[d.expert] += cost(m)
            self.settled += 1
            self._close(i)

    def expire(self, horizon: float) -> None:
        """Drop the duels opened before `horizon`: nobody came back, nothing to charge."""
        for i in made_before(self.duels, _opened, horizon):  # in the order they were opened
            self._close(i)
        for m in made_before(self.evicted, _taken, horizon):  # oldest first (took)
            del self.evicted[m]

    # ---- the lead ------------------------------------------------------------------------
    def choose(self, margin: float, now: float) -> bool:
        """Judge a trial that has its evictions, else hand the lead to the expert whose record clears the
        margin by most; True when the lead changed."""
        trial = self.trial
        if trial is None and self.leader != self.names[0] and not self.adopted and self._course_worse(now):
            self._fail(self.leader, now, COURSE_BAN_HALFLIVES)
            self.leader = self.names[0]
            self.reverts += 1
            self._new_record()
            return True
        if trial is not None:
            if now < trial.window_end:
                return False
            trial.windows[self.leader] += 1
            if not trial.done() and not trial.losing():  # the other order's turn
                self.leader = trial.before if self.leader == trial.candidate else trial.candidate
                trial.window_end = now + TRIAL_WINDOW_HALFLIVES * self.halflife
                return False
            self.trial = None
            self._new_record()
            c, b = trial.candidate, trial.before
            if (trial.per_request(c) > (1.0 - TRIAL_MARGIN) * trial.per_request(b)
                    or trial.cold_share(c) > (1.0 - TRIAL_MARGIN) * trial.cold_share(b)):
                # following it cost more on the same traffic: back to the last leader, the candidate sits out
                self._fail(trial.candidate, now, BAN_HALFLIVES)
                self.leader = trial.before
                self.reverts += 1
                return True
            self.leader = trial.candidate
            self.adopted = False
            self.course = {"requests": 0.0, "cold": 0.0}
            self.lead_since = now
            return False
        best, best_gain = "", 0.0
        for n in self.names:
            if n == self.leader or self.banned.get(n, -1.0) > now:
                continue
            w, lo = self.won[n], self.lost[n]
            if w + lo < MIN_SCORED or w < margin * lo:
                continue
            gain = w - margin * lo
            if gain > best_gain:
                best, best_gain = n, gain
        if not best:
            return False
        self.trial = Trial(self.leader, best, now + TRIAL_WINDOW_HALFLIVES * self.halflife)
        self.leader = best
        self.switches += 1
        self._new_record()
        return True

    def adopt(self, name: str, now: float) -> bool:
        """`name` leads from now, without a trial (its windows would see no evictions), on the whole experts' long
        record (whole.py), which judges its course; False where it leads already, sits out a ban or a trial runs."""
        if name == self.leader or name not in self.names or self.banned.get(name, -1.0) > now \
                or self.trial is not None:
            return False
        self.leader = name
        self.adopted = name != self.names[0]
        self.switches += 1
        self.lead_since = now
        self._new_record()
        return True

    def give_back(self, name: str, now: float) -> bool:
        """The adopted `name` did worse on its course (whole.py): the home order leads again and `name` sits out
        COURSE_BAN_HALFLIVES half-lives, doubled at each further failure; False where `name` does not lead."""
        if name != self.leader or not self.adopted:
            return False
        self._fail(name, now, COURSE_BAN_HALFLIVES)
        self.leader = self.names[0]
        self.adopted = False
        self.reverts += 1
        self._new_record()
        return True

    def _fail(self, n: str, now: float, halflives: float) -> None:
        """`n` failed (a trial or its course): it sits out `halflives` half-lives, doubled per earlier failure."""
        fails = self.fails.get(n, 0) + 1
        self.fails[n] = fails
        self.banned[n] = now + halflives * 2.0 ** (fails - 1) * self.halflife

    @staticmethod
    def _share(rec: dict[str, float]) -> float:
        return rec["cold"] / rec["requests"] if rec["requests"] > 0 else 0.0

    def _course_worse(self, now: float) -> bool:
        """The leader has led COURSE_MIN_HALFLIVES since its trial and its fleet served a share of requests
        cold more than COURSE_MARGIN above the home order's."""
        if now - self.lead_since < COURSE_MIN_HALFLIVES * self.halflife or self.course["requests"] < MIN_SCORED:
            return False
        return self._share(self.course) > (1.0 + COURSE_MARGIN) * self._share(self.home)

    def why(self) -> str:
        parts = ", ".join(f"{n} would have saved {self.won[n]:.1f} and cost {self.lost[n]:.1f}"
                          for n in self.names if n != self.leader)
        t = self.trial
        trial = (f"{t.candidate} on trial against {t.before} in turns ({t.before}'s victims cost "
                 f"{t.per_request(t.before):.4f}, {t.candidate}'s {t.per_request(t.candidate):.4f}; "
                 f"requests served cold: {t.cold_share(t.before):.1%} and {t.cold_share(t.candidate):.1%}); "
                 if t is not None else "")
        course = (f"since its trial {self._share(self.course):.1%} of requests served cold, against "
                  f"{self._share(self.home):.1%} under {self.names[0]}; "
                  if t is None and self.leader != self.names[0] and not self.adopted else "")
        if self.adopted:
            course = "adopted on the whole experts' long record of sparse cold starts; "
        return (f"expert {self.leader} leads ({trial}{course}its victims' returns cost {self.per_request():.4f} cold "
                f"requests per request; against the others' on this fleet, decayed: {parts})")

    def describe(self) -> dict[str, object]:
        return {"leader": self.leader, "switches": self.switches, "reverts": self.reverts,
                "on_trial": self.trial is not None, "adopted": self.adopted, "per_request": round(self.per_request(), 5),
                "cold_share": {"course": round(self._share(self.course), 4), "home": round(self._share(self.home), 4)},
                "settled": self.settled,
                "open_duels": len(self.duels),
                "won": {n: round(v, 2) for n, v in self.won.items()},
                "lost": {n: round(v, 2) for n, v in self.lost.items()}}

