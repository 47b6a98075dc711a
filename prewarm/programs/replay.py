"""The traffic player: replays a request trace against a running prewarm, as a request router would.

For every request it reports the request through `POST /hooks/requests` (batched), asks
`GET /hooks/route` where the model is warm, and runs `infer` on the replica it is given through that
GPU's Celery queue; a cold model is waited for, as a router would queue the request. So the hit rate and
cold-start figures it prints, and the console's, are real measurements.

Trace formats: the Azure Functions per-minute CSV (`HashOwner,HashApp,HashFunction[,Trigger]`, then one
column per minute) or a `timestamp,model` CSV. Azure functions are mapped onto catalog models: the
functions active in at least a few minutes are ranked by volume, and one is taken at each evenly spaced
rank, so the demo gets a mix of busy, bursty and rare models. Counts are scaled so the whole replay
stays near `--rate` requests per second of real time.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests

from prewarm import arg_types
from prewarm.domain import states as rs
from prewarm.domain import trace_format as tf

BUNDLED_TRACE = Path(__file__).parents[1] / "data" / "traces" / "azure2019-500" / "invocations.csv"  # prewarm/data


@dataclass(order=True)
class Request:
    t: float  # seconds from the trace start (trace time)
    model: str = field(compare=False)


def load_azure_minutes(path: Path, models: list[str], rng: random.Random, min_active: int = 5,
                       target_rate: float | None = None, speed: float = 60.0) -> list[Request]:
    """Requests in trace seconds, each minute's requests spread uniformly within it (seeded). The file's rules
    (header, rows, counts) are prewarm.domain.trace_format's, as the simulator's."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None) or []
        try:
            cols = tf.minute_columns(header)
            first_minute = min(n for _i, n in cols)
            minutes = max(n for _i, n in cols) - first_minute + 1
            tf.check_span(minutes * 60.0)  # before a row of that many minutes is made
        except ValueError as e:
            raise tf.at(path, 1, str(e)) from None
        rows: list[list[int]] = []
        for line, row in tf.rows(reader, len(header), path):
            counts = [0] * minutes
            try:
                for i, n in cols:
                    counts[n - first_minute] += tf.count(row[i])
            except ValueError as e:
                raise tf.at(path, line, str(e)) from None
            rows.append(counts)
    active = sorted((r for r in rows if sum(1 for x in r if x) >= min_active), key=sum)
    if not active:
        raise tf.at(path, None, f"no function is active in {min_active} minutes or more")
    n = len(models)
    if not n:  # every catalog model skipped or given steady --light traffic: nothing to map the trace onto
        return []
    picked = [active[min(len(active) - 1, (i * (len(active) - 1)) // max(1, n - 1))] for i in range(n)]
    totals = [max(1, sum(r)) for r in picked]
    # Thin each model's requests with probability p = min(1, c / total^0.75): busy models are thinned
    # most, rare ones kept whole, and every model keeps its own shape in time. c is solved (bisection)
    # so the whole replay runs near target_rate requests per real second.
    keep = [1.0] * n
    if target_rate:
        budget = target_rate * minutes * 60 / speed

        def kept(c: float) -> float:
            return sum(min(1.0, c / t**0.75) * t for t in totals)

        lo, hi = 0.0, max(totals) ** 0.75
        if kept(hi) > budget:
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if kept(mid) < budget else (lo, mid)
            keep = [min(1.0, lo / t**0.75) for t in totals]
    out: list[Request] = []
    for model, counts, p in zip(models, picked, keep, strict=True):
        for m, c in enumerate(counts):
            for _ in range(c):
                if p >= 1.0 or rng.random() < p:
                    out.append(Request(60 * m + 60 * rng.random(), model))
    out.sort()
    return out


def check_models(reqs: list[Request], catalog: list[str], path: Path) -> None:
    """A requests trace names its models: each must be in the catalog, or every request for it would be refused by
    the hooks and the replay would measure nothing of it."""
    known = set(catalog)
    unknown = sorted({r.model for r in reqs} - known)
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise tf.at(path, None, f"the catalog has no model {shown}: add them to the catalog, or replay an "
                                "azure-minute trace (its functions are mapped onto the catalog's models)")


def light_requests(models: list[str], span: float, every: float) -> list[Request]:
    """One request every `every` trace seconds for each of `models` over `span` trace seconds: steady
    light traffic that keeps a model with a slow start (an engine) warm instead of loading it in bursts."""
    if every <= 0:
        raise ValueError(f"light interval {every!r} must be positive")
    n = max(1, int(span // every))
    return [Request(i * every, m) for m in models for i in range(n)]


def split_models(models: list[str], light: list[str], skip: list[str]) -> tuple[list[str], list[str]]:
    """The catalog's models split into those mapped onto the trace and the --light ones (in the catalog),
    which get a steady stream instead; --skip ones get nothing."""
    steady = [m for m in light if m in models and m not in skip]
    return [m for m in models if m not in steady and m not in skip], steady


def load_requests_csv(path: Path) -> list[Request]:
    """A `timestamp,model` file's requests, by prewarm.domain.trace_format's rules (as the simulator's)."""
    out = []
    with open(path, newline="") as f:
        for t, model in tf.requests(csv.DictReader(f), path):
            out.append(Request(t, model))
    out.sort()
    t0 = out[0].t if out else 0.0
    try:
        tf.check_span(out[-1].t - t0 if out else 0.0)
    except ValueError as e:
        raise tf.at(path, None, str(e)) from None
    return [Request(r.t - t0, r.model) for r in out]


class Router:
    """HTTP client of the hooks, with per-thread keep-alive sessions."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._local = threading.local()

    def session(self) -> requests.Session:
        s = getattr(self._local, "s", None)
        if s is None:
            s = self._local.s = requests.Session()
            s.headers.update(self.headers)
        return s

    def report(self, counts: Counter[str], ts: float) -> None:
        events = [{"model": m, "count": c, "ts": ts} for m, c in counts.items()]
        if events:
            self.session().post(f"{self.url}/hooks/requests", json={"events": events}, timeout=30).raise_for_status()

    def route(self, model: str, *, retry: bool = False) -> dict:
        # retry=1 marks a repeat lookup of a request already counted, so the hit-rate metric counts
        # each request once, as a router polling for a cold model would.
        params = {"model": model, **({"retry": "1"} if retry else {})}
        resp = self.session().get(f"{self.url}/hooks/route", params=params, timeout=30)
        resp.raise_for_status()
        return resp.json()

    def catalog(self) -> list[str]:
        resp = self.session().get(f"{self.url}/api/models", timeout=30)
        resp.raise_for_status()
        return [m["id"] for m in resp.json()["models"]]


@dataclass
class Outcome:
    latency: float
    cold: bool
    ok: bool
    error: str = ""


class Player:
    def __init__(self, router: Router, celery_app, *, cold_timeout: float = 300.0) -> None:  # noqa: ANN001
        self.router = router
        self.celery = celery_app
        self.cold_timeout = cold_timeout

    def serve(self, req: Request, due: float) -> Outcome:
        """Route then infer one request; latency counts from when it was due, cold waits included."""
        cold = False
        deadline = due + self.cold_timeout
        try:
            while True:
                answer = self.router.route(req.model, retry=cold)
                ready = [x for x in answer.get("replicas", []) if x.get("state") == rs.READY]
                if ready:
                    break
                cold = True
                if time.monotonic() > deadline:
                    return Outcome(time.monotonic() - due, True, False, "no replica became ready")
                time.sleep(0.2)
            if self.celery is not None:
                from prewarm.celery_app import INFER

                target = ready[0]
                res = self.celery.send_task(INFER, args=[req.model], kwargs={"gpu": target["gpu"]},
                                            queue=target["queue"])
                res.get(timeout=self.cold_timeout, propagate=True)
                res.forget()
            return Outcome(time.monotonic() - due, cold, True)
        except Exception as exc:  # one failed request is a figure, not the end of the replay
            return Outcome(time.monotonic() - due, cold, False, str(exc)[:200])


def summarize(outcomes: list[Outcome], reported: int) -> dict:
    done = [o for o in outcomes if o.ok]
    lat = sorted(o.latency for o in done)

    def pct(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 4) if lat else None

    cold = sum(1 for o in outcomes if o.cold)
    errors = Counter(o.error for o in outcomes if not o.ok)
    return {"requests": len(outcomes), "reported": reported, "served": len(done),
            "warm": len(outcomes) - cold, "cold_starts": cold,
            "warm_share": round((len(outcomes) - cold) / len(outcomes), 4) if outcomes else None,
            "latency_seconds": {"p50": pct(0.50), "p99": pct(0.99),
                                "mean": round(statistics.fmean(lat), 4) if lat else None},
            "failed": len(outcomes) - len(done), "errors": dict(errors.most_common(5))}


def replay(requests_: list[Request], router: Router, player: Player, *, speed: float, concurrency: int,
           flush_s: float = 0.5, duration: float | None = None, loop: bool = False) -> dict:
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    reported = 0
    span = (requests_[-1].t + 1) if requests_ else 0
    start = time.monotonic()
    pending: Counter[str] = Counter()
    last_flush = start
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        lap = 0
        while True:
            for req in requests_:
                due = start + (lap * span + req.t) / speed
                if duration is not None and due - start > duration:
                    break
                now = time.monotonic()
                if due > now:
                    if pending and now - last_flush >= flush_s:
                        router.report(pending, time.time())
                        reported += sum(pending.values())
                        pending.clear()
                        last_flush = now
                    time.sleep(min(due - now, flush_s))
                pending[req.model] += 1

                def run(rq: Request = req, d: float = due) -> None:
                    o = player.serve(rq, d)
                    with lock:
                        outcomes.append(o)
                pool.submit(run)
            else:
                if loop:
                    lap += 1
                    continue
            break
        if pending:
            router.report(pending, time.time())
            reported += sum(pending.values())
    return summarize(outcomes, reported)


def cmd_replay(args: argparse.Namespace) -> int:
    from prewarm.celery_app import make_celery
    from prewarm.config import Settings
    from prewarm.runtime import redis_url

    settings = Settings.from_env()
    router = Router(args.url, args.token or settings.hook_token)
    rng = random.Random(args.seed)
    trace = Path(args.trace) if args.trace else BUNDLED_TRACE
    if not trace.is_file():  # before waiting for the web: a mistyped path is said at once
        print(f"prewarm replay: {trace}: no such file", file=sys.stderr)
        return 2
    # Wait for the web process (under `prewarm up` it starts beside us).
    deadline = time.monotonic() + args.wait_for_web
    while True:
        try:
            models = router.catalog()
            break
        except requests.RequestException as exc:
            if time.monotonic() > deadline:
                print(f"prewarm replay: {args.url} does not answer: {exc}", file=sys.stderr)
                return 2
            time.sleep(0.5)
    try:
        if args.format == "requests":
            reqs = load_requests_csv(trace)
            check_models(reqs, models, trace)
            light = []
        else:
            models, light = split_models(models, args.light, args.skip)
            if args.models:
                models = models[: args.models]
            reqs = load_azure_minutes(trace, models, rng, target_rate=args.rate, speed=args.speed)
        if light:
            span = (reqs[-1].t + 1) if reqs else args.light_interval * args.speed
            reqs = sorted(reqs + light_requests(light, span, args.light_interval * args.speed))
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as exc:  # the file, or an option, says what to fix
        print(f"prewarm replay: {exc}", file=sys.stderr)
        return 2
    celery = None if args.no_infer else make_celery(args.redis_url or redis_url(settings, start=False))
    player = Player(router, celery, cold_timeout=args.cold_timeout)
    per_model = Counter(r.model for r in reqs)
    print(f"prewarm replay: {len(reqs)} requests over {len(per_model)} models from {trace.name}, "
          f"speed ×{args.speed:g}", file=sys.stderr)
    summary = replay(reqs, router, player, speed=args.speed, concurrency=args.concurrency,
                     duration=args.duration, loop=args.loop)
    if args.json:
        print(json.dumps(summary))
    else:
        lat = summary["latency_seconds"]
        print(f"requests {summary['requests']}  warm share {summary['warm_share']}  cold starts "
              f"{summary['cold_starts']}  latency p50 {lat['p50']} s  p99 {lat['p99']} s  failed "
              f"{summary['failed']}")
    return 0 if summary["failed"] == 0 else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a request trace through the hooks, as a request router would")
    p.add_argument("trace", nargs="?", help=f"trace CSV (default: the bundled {BUNDLED_TRACE.parent.name})")
    p.add_argument("--format", choices=("azure-minute", "requests"), default="azure-minute")
    p.add_argument("--speed", type=arg_types.positive, default=60.0, help="trace seconds per real second")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--token", help="hook token (default PREWARM_HOOK_TOKEN)")
    p.add_argument("--redis-url", help="Redis of the fleet, to run infer (default PREWARM_REDIS_URL)")
    p.add_argument("--rate", type=arg_types.non_negative, default=4.0,
                   help="azure-minute: scale counts to about this many req/s (0: the trace's own counts)")
    p.add_argument("--models", type=arg_types.whole_at_least(1), help="azure-minute: map onto the first N catalog models")
    p.add_argument("--light", action="append", default=[], metavar="MODEL",
                   help="azure-minute: give MODEL one request every --light-interval seconds instead of a "
                        "trace's bursts (a model slow to start, such as a vLLM engine; repeatable)")
    p.add_argument("--skip", action="append", default=[], metavar="MODEL",
                   help="azure-minute: send MODEL no traffic (repeatable)")
    p.add_argument("--light-interval", type=arg_types.positive, default=20.0,
                   help="real seconds between a --light model's requests (default 20)")
    p.add_argument("--concurrency", type=arg_types.whole_at_least(1), default=16)
    p.add_argument("--duration", type=arg_types.positive, help="stop after this many real seconds")
    p.add_argument("--loop", action="store_true", help="start over at the end of the trace")
    p.add_argument("--cold-timeout", type=arg_types.positive, default=300.0)
    p.add_argument("--no-infer", action="store_true", help="route only; do not run infer")
    p.add_argument("--wait-for-web", type=arg_types.non_negative, default=60.0)
    p.add_argument("--seed", type=arg_types.whole_at_least(0), default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)

