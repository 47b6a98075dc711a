"""faascache: Greedy-Dual keep-alive (Fuerst & Sharma, ASPLOS 2021)."""

from __future__ import annotations

from prewarm.domain.action_kinds import DEMAND

from .base import Fleet, ReplicaLike, Rule


class FaasCache(Rule):
    """faascache: Fuerst & Sharma, "FaasCache: Keeping Serverless Computing Alive with Greedy-Dual
    Caching", ASPLOS 2021 — Greedy-Dual keep-alive. Each resident function has
    priority = clock + frequency × cost / size, recomputed on every invocation; frequency counts
    the function's invocations while it is resident (reset when it is evicted); cost = its cold-start
    (load) time; size = its memory. When space is needed the lowest priority is evicted and the clock
    becomes the priority of the last evicted function."""

    name = "faascache"
    monotone_misses = True
    monotone_keys = True

    def attach(self, fleet: Fleet) -> None:
        super().attach(fleet)
        self.clock = 0.0
        self.freq = [0] * fleet.n_models
        self.prio: dict[tuple[int, int], float] = {}

    def _set(self, m: int, gi: int) -> None:
        s = self.fleet
        self.prio[(m, gi)] = self.clock + self.freq[m] * s.load_s[m] / (s.sizes[m] / (1 << 30))

    def on_request(self, t: float, m: int, warm: bool) -> None:
        self.freq[m] += 1
        for gi in self.fleet.replicas[m]:
            self._set(m, gi)

    def on_miss(self, t: float, m: int) -> None:
        s = self.fleet

        def key(r: ReplicaLike) -> float:
            return self.prio.get((r.model, r.gpu), self.clock)

        rep = s.place_evicting(m, key, kind=DEMAND)
        if rep is None:
            return
        gone = {(r.model, r.gpu) for r in s.victims}
        if gone:
            self.clock = max(self.clock, max(self.prio.get(k, self.clock) for k in gone))
            for k in gone:
                self.prio.pop(k, None)
                if not s.replicas[k[0]]:
                    self.freq[k[0]] = 0
        self._set(m, rep.gpu)
