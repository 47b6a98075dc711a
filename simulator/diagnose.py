"""A diagnostic replay: one policy on one trace and fleet, its cold starts split by what caused them.

    python -m simulator.diagnose TRACE [--format azure-minute|requests] --profile FILE [--gpus N]
        [--gpu-memory 80GiB] [--hours H] [--seed S] [--policy NAME] [--load-slots N] [--set FIELD=VALUE]
        [--json OUT]

The trace is read as `prewarm simulate` and the sweep read it (`simulator.trace.read_trace`).

Each cold request belongs to an *episode*: the stretch from a request that found the model with no
replica until a replica of it is ready. An episode's cause is what left the model without one:

- `first`: the model's first request ever (and its first load's requests after it);
- `eviction`: the model was evicted since its last ready replica (the eviction's victim numbers:
  its idle time when evicted, how long until it was asked for again, its size, the kind of load
  it made room for);
- `forecast_late`: a load ahead of demand (speculative, fill, prefetch) was in flight but not ready.

Within an episode each cold request is split by the model's state when it arrived: `none` (no load
sent yet: the request that opens the episode, or one waiting in the policy for a free link),
`queued` (a load waiting in its GPU's slot queue) or `loading`. The figures are the diagnostics
docs/simulation.md quotes; nothing here changes what any policy decides.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import Counter
from typing import Any

import numpy as np

from prewarm import arg_types
from prewarm.domain.action_kinds import AHEAD_OF_DEMAND
from prewarm.domain.policy import STALE_RATE_READINGS, PolicyConfig
from prewarm.domain.states import PENDING, READY

from .engine import Simulation
from .fleet import Replica
from .policies import POLICIES, Prewarm
from .trace import FORMATS, GIB, GPU_MEMORY, load_profile, read_trace


class DiagnosticSimulation(Simulation):
    """The engine, recording each eviction (and the load it made room for) and each cold request's class."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.per_model = self.trace.per_model_times()
        self.ever_ready = [False] * self.n_models
        self.last_eviction: dict[int, dict] = {}  # model -> its eviction not yet followed by a request
        self.unattached: list[dict] = []  # evictions waiting for the load they made room for
        self.evicted: list[dict] = []
        self.classes: Counter[str] = Counter()
        self.episode: dict[int, str] = {}  # model -> cause of its open episode
        self.eviction_cold: list[tuple[dict, int]] = []  # (eviction, cold starts its episode had)
        self.load_kinds: Counter[str] = Counter()
        # prewarm only: for each return after an eviction, whether its timeline had turned hot
        self.forecast_of: Any = None
        self.forecast: Counter[str] = Counter()
        self.forecast_requests: dict[str, list[int]] = {}  # timeline label -> the returning model's requests that day
        self.ahead_since: dict[int, float] = {}  # model -> its last ahead-of-demand load's start
        self.ahead_used: Counter[str] = Counter()  # ahead-of-demand loads that served a request, by kind

    def _count_ahead(self, r: Replica) -> None:
        if r.kind in AHEAD_OF_DEMAND and r.last_request is not None:
            self.ahead_used[r.kind] += 1

    def next_request(self, m: int, t: float) -> float:
        a = self.per_model[m]
        i = int(np.searchsorted(a, t, side="right"))
        return float(a[i]) if i < len(a) else float("inf")

    def evict(self, m: int, gi: int) -> bool:
        r = self.gpus[gi].residents.get(m)
        last = None if r is None else r.last_request
        ok = super().evict(m, gi)
        if ok:
            self._count_ahead(r)  # type: ignore[arg-type]
            t = self.now
            e = {"t": t, "model": m, "gib": self.sizes[m] / GIB,
                 "idle_s": t - (last if last is not None else r.since),  # type: ignore[union-attr]
                 "return_s": self.next_request(m, t) - t, "requests": len(self.per_model[m]),
                 "for": None, "cold": 0}
            self.last_eviction[m] = e
            self.unattached.append(e)
            self.evicted.append(e)
        return ok

    def start_load(self, m: int, gi: int, kind: str = "") -> Replica | None:
        r = super().start_load(m, gi, kind)
        if r is not None:
            self.load_kinds[kind or "?"] += 1
            if kind in AHEAD_OF_DEMAND:
                self.ahead_since[m] = self.now
            for e in self.unattached:
                e["for"] = kind or "?"
            self.unattached.clear()
        return r

    def classify(self, m: int) -> None:
        """A cold request of model m has just arrived."""
        reps = list(self.replicas[m].values())
        state = "none" if not reps else ("queued" if all(r.state == PENDING for r in reps) else "loading")
        cause = self.episode.get(m)
        if cause is None:  # the request that opens an episode
            if reps and any(r.kind in AHEAD_OF_DEMAND for r in reps):
                cause = "forecast_late"
            elif not self.ever_ready[m]:
                cause = "first"
            elif m in self.last_eviction:
                cause = "eviction"
            else:
                cause = "other"
            self.episode[m] = cause
        e = self.last_eviction.get(m)
        if cause == "eviction" and e is not None:
            e["cold"] += 1
        self.classes[f"{cause}/{state}"] += 1
        if cause == "eviction" and state == "none" and self.forecast_of is not None:
            label = self.forecast_of(m, self.now)
            self.forecast[label] += 1
            self.forecast_requests.setdefault(label.split("+")[0], []).append(len(self.per_model[m]))

    def _load_done(self, gi: int, version: int) -> None:
        g = self.gpus[gi]
        before = {id(r) for r in g.link.jobs}
        super()._load_done(gi, version)
        for r in list(g.residents.values()):
            if id(r) in before and r.state == READY:
                self.ever_ready[r.model] = True
                self.episode.pop(r.model, None)
                self.last_eviction.pop(r.model, None)


class _Proxy:
    """Wraps a policy: classifies each cold request before the policy sees it."""

    def __init__(self, inner: Any, sim: DiagnosticSimulation) -> None:
        self._inner = inner
        self._sim = sim

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def hot_state(self, m: int, t: float) -> str:
        """prewarm: where the model's idle-time timeline stood at this return (before the request is added)."""
        p = self._inner
        name = p.names[m]
        last = p.history.last_arrival(name)
        got = p.state.arrival.get(name)
        if last is None or got is None:
            return "no_model"
        g = p.cfg.grid_s
        d = t - (last // g) * g
        am = got[1]
        hots = [(a, b) for a, b, lab in am.segments if lab == "hot" and a <= d]
        spec = self._sim.ahead_since.get(m)
        tag = "" if spec is None or spec < last else "+ahead_loaded"
        if not hots:
            return "never_hot" + tag
        if any(a <= d < b for a, b in hots):
            return "hot_now" + tag
        late = d - hots[-1][1]
        return ("hot_ended<10m" if late < 600 else "hot_ended>10m") + tag

    def on_request(self, t: float, m: int, warm: bool) -> None:
        if not warm:
            self._sim.classify(m)
        elif m in self._sim.last_eviction:
            self._sim.last_eviction.pop(m)
        self._inner.on_request(t, m, warm)


def _quantiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    a = np.array(xs, dtype=float)
    a = a[np.isfinite(a)]
    if not len(a):
        return {"finite": 0}
    return {f"p{q}": round(float(np.percentile(a, q)), 1) for q in (10, 25, 50, 75, 90)}


def memory_fit(sim: Simulation, hours: float = 1.0) -> dict[str, Any]:
    """Per window of `hours`: the bytes of the models asked for in it, against the fleet's."""
    fleet = sum(g.capacity for g in sim.gpus)
    span = hours * 3600.0
    t = sim.trace
    sizes = np.array(sim.sizes, dtype=float)
    windows = int(np.ceil(max(t.span_s, 1.0) / span))
    ratios = []
    for w in range(windows):
        sel = (t.times >= w * span) & (t.times < (w + 1) * span)
        ratios.append(float(sizes[np.unique(t.mids[sel])].sum()) / fleet)
    reqs = np.bincount(t.mids, minlength=sim.n_models)
    order = np.argsort(-reqs / np.maximum(sizes / GIB, 1e-3))  # most requests per GiB first
    cum = np.cumsum(sizes[order])
    fits = int(np.searchsorted(cum, fleet, side="right"))
    return {"fleet_gib": fleet / GIB, "catalog_gib": float(sizes.sum()) / GIB,
            f"active_per_{hours:g}h_over_fleet": _quantiles(ratios),
            "models_fitting_by_requests_per_gib": fits,
            "their_share_of_requests": float(reqs[order[:fits]].sum() / max(1, reqs.sum()))}


def diagnose(sim: DiagnosticSimulation, policy: Any) -> dict[str, Any]:
    proxy = _Proxy(policy, sim)
    if isinstance(policy, Prewarm):
        sim.forecast_of = proxy.hot_state
    sim.run(proxy)
    for g in sim.gpus:
        for r in g.residents.values():
            sim._count_ahead(r)
    res = sim.results()
    ev = sim.evicted
    costly = [e for e in ev if e["cold"]]
    by_for = Counter(e["for"] for e in ev)
    return {
        "cold_starts": res["cold_starts"], "cold_wait_seconds": res["cold_wait_seconds"],
        "loads": res["loads"], "queued_loads": res["queued_loads"],
        "load_kinds": dict(sim.load_kinds), "ahead_loads_used": dict(sim.ahead_used),
        "classes": dict(sorted(sim.classes.items())),
        "returns_by_timeline": dict(sim.forecast),
        "returns_requests_per_day_by_timeline": {k: _quantiles(v) for k, v in sorted(sim.forecast_requests.items())},
        "evictions": len(ev), "evictions_by_load_kind": dict(by_for),
        "evictions_with_cold": len(costly), "cold_after_eviction": sum(e["cold"] for e in ev),
        "costly_for": dict(Counter(e["for"] for e in costly)),
        "costly_return_s": _quantiles([e["return_s"] for e in costly]),
        "costly_idle_s": _quantiles([e["idle_s"] for e in costly]),
        "costly_gib": _quantiles([e["gib"] for e in costly]),
        "costly_requests_per_day": _quantiles([e["requests"] for e in costly]),
        "all_return_s": _quantiles([e["return_s"] for e in ev]),
        "all_idle_s": _quantiles([e["idle_s"] for e in ev]),
        "memory": memory_fit(sim),
    }


def config_override(item: str) -> tuple[str, Any]:
    """A `--set FIELD=VALUE`: the PolicyConfig field and its value, read by the field's kind (a flag true/false, a
    whole number, a number, `none` where the field may be unset, or one of its readings); a number is finite and not
    negative (the knobs are durations, shares, counts and rates), a tick above 0. ValueError says what to write."""
    name, eq, raw = item.partition("=")
    default = _DEFAULTS.get(name, _MISSING)
    if not eq:
        raise ValueError(f"{item!r}: write FIELD=VALUE (e.g. tick_s=2)")
    if default is _MISSING:
        raise ValueError(f"{item!r}: PolicyConfig has no field {name!r} (prewarm/domain/policy/types.py lists them)")
    v = raw.strip().lower()
    if isinstance(default, bool):
        if v not in ("true", "false"):
            raise ValueError(f"{item!r}: {name} is true or false")
        return name, v == "true"
    if isinstance(default, str):
        readings = _READINGS.get(name)
        if readings is not None and v not in readings:
            raise ValueError(f"{item!r}: {name} is one of {', '.join(readings)}")
        return name, v if readings is not None else raw
    if v == "none":
        if default is not None:
            raise ValueError(f"{item!r}: {name} cannot be none (a number; {default!r} by default)")
        return name, None
    try:
        x: float = int(v) if isinstance(default, int) else float(v)
    except ValueError:
        kind = "a whole number" if isinstance(default, int) else "a number" + (" or none" if default is None else "")
        raise ValueError(f"{item!r}: {name} is {kind}") from None
    if not 0 <= x < math.inf or (name == "tick_s" and x == 0):
        raise ValueError(f"{item!r}: {name} must be a finite number {'above' if name == 'tick_s' else 'of at least'} 0")
    return name, x


_MISSING = object()
_READINGS = {"refute_stale_rate": STALE_RATE_READINGS}  # a str field's words
_DEFAULTS: dict[str, Any] = {f.name: getattr(PolicyConfig(), f.name) for f in dataclasses.fields(PolicyConfig)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.diagnose", description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--format", choices=FORMATS, default="azure-minute")
    p.add_argument("--profile")
    p.add_argument("--hours", type=float, help="replay only the first HOURS of the trace")
    p.add_argument("--gpus", type=arg_types.whole_at_least(1), default=16)
    p.add_argument("--gpu-memory", type=arg_types.size_at_least(1), default=GPU_MEMORY)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", default="prewarm", choices=list(POLICIES))
    p.add_argument("--load-slots", type=arg_types.whole_at_least(0), default=2, help="0: every load at once")
    p.add_argument("--json", dest="json_out", type=arg_types.output_file)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="prewarm only: a PolicyConfig field for this replay (a number, or none)")
    a = p.parse_args(argv)
    try:
        overrides = dict(config_override(item) for item in a.set)
    except ValueError as e:
        p.error(f"--set {e}")
    try:
        trace = read_trace(a.trace, a.format, a.seed, a.hours)
        sizes, loads = load_profile(a.profile, trace.models)
    except (OSError, ValueError) as e:
        print(f"diagnose: {e}", file=sys.stderr)
        return 2
    sim = DiagnosticSimulation(trace, sizes, loads, a.gpus, a.gpu_memory, load_slots=a.load_slots)
    pol = Prewarm(PolicyConfig(**overrides)) if a.policy == "prewarm" else POLICIES[a.policy]()
    out = diagnose(sim, pol)
    out["config"] = overrides
    text = json.dumps(out, indent=2)
    print(text)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
