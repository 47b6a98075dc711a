"""Operator commands: models list, fleet, preload, evict, stage, unstage, pin, unpin, drain, undrain, events.

The JSON forms (`models list --json`, `fleet --json`) are stable interfaces operators script against.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from prewarm import arg_types, events, keys, state
from prewarm.catalog_entries import CatalogError
from prewarm.domain import states as rs
from prewarm.domain.action_kinds import OPERATOR
from prewarm.services import drain, operator
from prewarm.store import drains, overlays
from prewarm.units import format_bytes

T = TypeVar("T")
POLL_S = 0.2  # how often a --wait looks again


def _poll(check: Callable[[], T | None], timeout: float) -> T | None:
    """`check()` every POLL_S until it answers (anything but None), or None once `timeout` seconds pass."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (got := check()) is not None:
            return got
        time.sleep(POLL_S)
    return None


def _ctx():  # noqa: ANN202 - deferred import keeps `prewarm --help` fast
    from prewarm.context import Context

    return Context()


def _err(msg: str) -> int:
    print(f"prewarm: {msg}", file=sys.stderr)
    return 2


def _lookup_err(exc: Exception) -> int:
    """_err for a failed catalog/fleet lookup: its message, not KeyError's quoted repr of it."""
    return _err(str(exc.args[0]) if exc.args else str(exc))


def cmd_models_list(args: argparse.Namespace) -> int:
    from prewarm.catalog import load_catalog
    from prewarm.config import Settings

    settings = Settings.from_env()
    try:
        cat = load_catalog(args.catalog or settings.catalog, strict=False)
    except CatalogError as exc:
        return _err(str(exc))
    for problem in cat.problems.values():  # the healthy entries are listed; the broken ones named, exit 1
        print(f"prewarm: {cat.path}: {problem}", file=sys.stderr)
    if args.json:
        out: dict = {"models": [m.summary() for m in cat.models]}
        if cat.problems:
            out["problems"] = cat.problems
        try:  # strict JSON: a non-finite number (the catalog refuses them) fails here, never prints NaN
            text = json.dumps(out, indent=2, allow_nan=False)
        except ValueError as exc:
            return _err(f"{cat.path}: cannot write the catalog as JSON: {exc}")
        print(text)
        return 1 if cat.problems else 0
    print(f"{'id':28} {'version':10} {'size':>12} {'shards':>6}  builder")
    for m in cat.models:
        print(f"{m.id:28} {m.version:10} {format_bytes(m.size_bytes):>12} {m.shards:>6}  {m.builder}")
    return 1 if cat.problems else 0


def fleet_json(fleet: state.Fleet) -> dict:
    # "nodes" (host caches and staged models) was added beside "gpus"; "gpus" keeps its shape.
    return {"gpus": [g.public() for g in fleet.gpus], "nodes": [n.public() for n in fleet.nodes]}


def cmd_fleet(args: argparse.Namespace) -> int:
    ctx = _ctx()
    fleet = state.read_fleet(ctx.r)
    if args.json:
        print(json.dumps(fleet_json(fleet), indent=2))
        return 0
    if not fleet.gpus:
        print("no GPUs: start a worker with `prewarm worker`")
    for g in fleet.gpus:
        flag = "  [STALE: no heartbeat]" if not g.alive else "" if g.fresh else "  [LATE heartbeat: no new loads]"
        if g.alive and g.draining:
            flag += "  [DRAINING: no new loads]"
        print(f"{g.id}  used {format_bytes(g.used_bytes)} / {format_bytes(g.total_bytes)}, "
              f"free {format_bytes(g.free_bytes)}{flag}")
        for rep in g.replicas:
            extra = f" {rep.progress:.0%}" if rep.state == rs.LOADING else ""
            err = f"  error: {rep.error}" if rep.error else ""
            print(f"    {rep.model}@{rep.version:8} {rep.state}{extra:5} {format_bytes(rep.bytes):>10}{err}")
    for n in fleet.nodes:
        print(f"{n.node} host cache  used {format_bytes(n.used_bytes)} / {format_bytes(n.budget_bytes)}, "
              f"free {format_bytes(n.free_bytes)}{' (pinned)' if n.pinned else ''}")
        for x in n.staged:
            extra = f" {x.progress:.0%}" if x.state == rs.STAGING else ""
            print(f"    {x.model}@{x.version:8} {x.state}{extra:5} {format_bytes(x.bytes):>10}")
    return 0


def _wait_gone(ctx, model: str, version: str, gpu: str, timeout: float) -> int:  # noqa: ANN001
    departure = state.Departure(gpu, ctx.settings.heartbeat_ttl)

    def gone() -> int | None:
        g = state.read_fleet(ctx.r).gpu(gpu)
        if (left := departure.left(g)) is not None:
            return _err(left)
        if g is None or not g.alive:
            return None  # its heartbeat lapsed a moment: wait for it to come back
        if not any(x.model == model and x.version == version for x in g.replicas):
            print(f"{model}@{version} evicted from {gpu}")
            return 0
        return None

    rc = _poll(gone, timeout)
    return rc if rc is not None else _err(f"timed out after {timeout:.0f} s waiting for {model} to be gone from {gpu}")


def cmd_preload(args: argparse.Namespace) -> int:
    ctx = _ctx()
    try:
        entry = operator.entry(ctx, args.model, args.version)
        d = operator.preload(ctx, entry, args.gpu, args.reason or "operator preload from the CLI")
    except (operator.Refused, CatalogError) as exc:
        return _lookup_err(exc)
    print(d.message)
    if not args.wait:
        return 0
    # This attempt's own outcome (its task), never an older attempt's `failed` record still listed.
    out, error = _task_outcome(ctx, d, args.timeout, gpu=d.gpu)
    if error is not None:
        return _err(f"preload of {entry.key} on {d.gpu} failed: {error}")
    assert out is not None
    already = " (already resident)" if out.get("noop") else ""
    print(f"{entry.key} ready on {d.gpu}{already}: {format_bytes(out['bytes'])}, load "
          f"{out['load_seconds'] or 0:.2f} s, warmup {out['warmup_seconds'] or 0:.2f} s")
    return 0


def cmd_evict(args: argparse.Namespace) -> int:
    ctx = _ctx()
    try:
        entry = operator.entry(ctx, args.model, args.version)
        done = operator.evict(ctx, entry, args.gpu, args.reason or "operator evict from the CLI")
    except operator.Refused as exc:
        if exc.conflict and exc.field == "model":  # nothing resident: already as the operator wants, exit 0
            print(exc.message)
            return 0
        return _lookup_err(exc)
    except CatalogError as exc:
        return _lookup_err(exc)
    rc = 0
    for x in done:
        if not x.sent.sent:
            rc = _err(x.sent.message)
            continue
        print(x.sent.message)
        if args.wait:
            rc = _wait_gone(ctx, entry.id, entry.version, x.gpu.id, args.timeout) or rc
    return rc


def pick_node_gpu(fleet: state.Fleet, node: str | None, size: int) -> state.Gpu:
    """A live GPU of `node` to carry a stage/unstage task (the host cache is the node's; any of its queues
    reaches it). Without `node`: the node whose host cache has the most free bytes."""
    alive = fleet.alive()
    if not alive:
        raise LookupError("no GPU in the fleet: start a worker with `prewarm worker`")
    if node is None:
        caches = [n for n in fleet.nodes if any(g.node == n.node for g in alive)]
        if not caches:
            raise LookupError("no node announces a host cache (workers older than the staging tier?)")
        best = max(caches, key=lambda n: (n.free_bytes, n.node))
        if size > best.budget_bytes:
            raise LookupError(f"model needs {format_bytes(size)}, more than any node's host cache holds "
                              f"(largest {format_bytes(max(n.budget_bytes for n in caches))}; PREWARM_HOST_CACHE)")
        node = best.node
    gpu = state.node_carrier(alive, node)
    if gpu is None:
        names = ", ".join(sorted({g.node for g in alive}))
        raise LookupError(f"node {node!r} has no live GPU in the fleet (nodes: {names})")
    return gpu


def _task_outcome(ctx, d, timeout: float, *, gpu: str | None = None) -> tuple[dict | None, str | None]:  # noqa: ANN001
    """Wait for a dispatched task's result: (result, None), or (None, the worker's reason). With `gpu`, stop
    waiting when that GPU leaves the fleet (its worker died: no result will come)."""
    res = ctx.celery.AsyncResult(d.task_id)
    # Gone only once its heartbeat has stayed away for a TTL: a lapse for a moment is not a dead worker.
    departure = None if gpu is None else state.Departure(gpu, ctx.settings.heartbeat_ttl)

    def outcome() -> tuple[dict | None, str | None] | None:
        if res.ready():
            if res.successful():
                return res.result, None
            exc = res.result
            return None, str(exc) or type(exc).__name__
        if departure is not None and (left := departure.left(state.read_fleet(ctx.r).gpu(departure.gpu))):
            return None, left
        return None

    got = _poll(outcome, timeout)
    return got if got is not None else (None, f"no outcome within {timeout:.0f} s (`prewarm fleet` shows where it stands)")


def cmd_stage(args: argparse.Namespace) -> int:
    ctx = _ctx()
    try:
        entry = ctx.catalog.get(args.model, args.version)
        gpu = pick_node_gpu(state.read_fleet(ctx.r), args.node, entry.size_bytes)
    except (KeyError, LookupError, CatalogError) as exc:
        return _lookup_err(exc)
    d = ctx.dispatcher.stage(entry.id, entry.version, gpu, actor="operator",
                             reason=args.reason or "operator stage from the CLI", kind=OPERATOR, value=args.value)
    if not d.sent and not (args.wait and d.held is not None and d.held.action == "stage"
                           and d.held.version == entry.version):
        return _err(d.message)
    print(d.message)
    if not args.wait:
        return 0
    if d.sent:
        out, error = _task_outcome(ctx, d, args.timeout)
        if error is not None:
            return _err(f"stage of {entry.key} on {gpu.node} failed: {error}")
        assert out is not None
        evicted = f" (evicted {', '.join(out['evicted'])})" if out.get("evicted") else ""
        print(f"{entry.key} staged on {gpu.node}: {format_bytes(out['bytes'])} in {out['stage_seconds']:.2f} s"
              f"{evicted}; host cache free {format_bytes(out['host_cache']['free_bytes'])}")
        return 0
    # The same stage is in flight already: watch the node's records instead.
    def staged() -> int | None:
        n = state.read_fleet(ctx.r).node(gpu.node)
        x = n.get(entry.id, entry.version) if n else None
        if x is not None and x.state == rs.STAGED:
            print(f"{entry.key} staged on {gpu.node}: {format_bytes(x.bytes)}")
            return 0
        if x is None and not ctx.r.exists(keys.intent(entry.id, state.host_id(gpu.node))):
            return _err(f"stage of {entry.key} on {gpu.node} did not complete (see `prewarm events`)")
        return None

    rc = _poll(staged, args.timeout)
    return rc if rc is not None else _err(
        f"timed out after {args.timeout:.0f} s waiting for {entry.key} to be staged on {gpu.node}")


def cmd_unstage(args: argparse.Namespace) -> int:
    ctx = _ctx()
    try:
        entry = ctx.catalog.get(args.model, args.version)
    except (KeyError, CatalogError) as exc:
        return _lookup_err(exc)
    fleet = state.read_fleet(ctx.r)
    nodes = [n.node for n in fleet.nodes if args.node in (None, n.node) and n.get(entry.id, entry.version)]
    if not nodes:
        where = f" on {args.node}" if args.node else ""
        print(f"{entry.key} is not staged{where}: nothing to unstage")
        return 0
    rc = 0
    for node in nodes:
        try:
            gpu = pick_node_gpu(fleet, node, 0)
        except LookupError as exc:
            rc = _err(str(exc))
            continue
        d = ctx.dispatcher.unstage(entry.id, entry.version, gpu, actor="operator",
                                   reason=args.reason or "operator unstage from the CLI")
        if not d.sent:
            rc = _err(d.message)
            continue
        print(d.message)
        if args.wait:
            out, error = _task_outcome(ctx, d, args.timeout)
            if error is not None:
                rc = _err(f"unstage of {entry.key} on {node} failed: {error}")
                continue
            assert out is not None
            print(f"{entry.key} unstaged from {node}: {format_bytes(out['bytes_freed'])} freed")
    return rc


def cmd_pin(args: argparse.Namespace) -> int:
    ctx = _ctx()
    if args.model not in ctx.catalog:
        return _err(f"unknown model {args.model!r}: `prewarm models list` shows the catalog")
    overlays.set_pinned(ctx.r, args.model, args.command == "pin")
    events.record(ctx.r, args.command, "operator", model=args.model, reason=f"operator {args.command} (CLI)")
    print(f"{args.model} {args.command}ned")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    ctx = _ctx()
    s = ctx.settings
    try:
        if args.command == "undrain":
            done = drain.end(ctx.r, args.node, actor="operator", reason=args.reason or "operator undrain from the CLI",
                             maxlen=s.event_log_max)
            print(f"{args.node} takes loads again" if done is not None else f"{args.node} is not draining: nothing to undo")
            return 0
        begun = drain.begin(ctx.r, args.node, actor="operator", reason=args.reason or "operator drain from the CLI",
                            grace_s=s.drain_grace, maxlen=s.event_log_max)
    except drain.UnknownNode as exc:
        return _err(exc.message)
    print(begun.message)
    if not args.wait:
        return 0

    def drained() -> int | None:
        if drains.get(ctx.r, args.node) is None:
            return _err(f"the drain of {args.node} was undone (`prewarm undrain`) while waiting")
        fleet = state.read_fleet(ctx.r, include_stale=False)
        if not any(g.node == args.node for g in fleet.alive()):
            print(f"{args.node} drained: its worker has left the fleet")
            return 0
        return None

    rc = _poll(drained, args.timeout)
    return rc if rc is not None else _err(f"timed out after {args.timeout:.0f} s waiting for {args.node} to drain")


def cmd_events(args: argparse.Namespace) -> int:
    ctx = _ctx()
    evs = events.read(ctx.r, limit=args.limit, model=args.model, gpu=args.gpu)
    if args.json:
        print(json.dumps({"events": [e.public() for e in evs]}, indent=2))
        return 0
    for e in reversed(evs):
        print(f"{time.strftime('%H:%M:%S', time.localtime(e.ts))} {e.actor:9} {e.kind:8} {e.model:20} "
              f"{e.gpu:18} {e.reason}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from prewarm.commands import subgroup

    models = subgroup(sub, "models", "the model catalog")
    p = models.add_parser("list", help="print the catalog")
    p.add_argument("--json", action="store_true")
    p.add_argument("--catalog", help="catalog file (default PREWARM_CATALOG)")
    p.set_defaults(func=cmd_models_list)

    p = sub.add_parser("fleet", help="print every GPU with its memory and replicas")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fleet)

    gpu_help = "node/device or device (default: most free memory)"
    node_help = "node name (default: stage on the node with the most free host cache)"
    gpu_wait, node_wait = "wait until ready / gone; non-zero on failure", "wait for the worker's outcome; non-zero on failure"
    for name, func, helptext, where, where_help, wait_help in (
            ("preload", cmd_preload, "load and warm a model onto a GPU", "--gpu", gpu_help, gpu_wait),
            ("evict", cmd_evict, "evict a model from a GPU (every GPU unless --gpu)", "--gpu", gpu_help, gpu_wait),
            ("stage", cmd_stage, "stage a model's weights in a node's host memory (promoted fast by a preload)",
             "--node", node_help, node_wait),
            ("unstage", cmd_unstage, "drop a model's staged weights from host memory (every node unless --node)",
             "--node", node_help, node_wait)):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("model")
        p.add_argument("--version", help="catalog version (default: the current one)")
        p.add_argument(where, help=where_help)
        p.add_argument("--wait", action="store_true", help=wait_help)
        p.add_argument("--timeout", type=arg_types.positive, default=300.0)
        p.add_argument("--reason", help="recorded in the event log")
        if name == "stage":
            p.add_argument("--value", type=arg_types.finite, default=0.0,
                           help="keep-value for the host cache's value-per-byte eviction (default 0)")
        p.set_defaults(func=func)

    for name in ("pin", "unpin"):
        p = sub.add_parser(name, help=f"{name} a model (pinned models are kept resident, never evicted)")
        p.add_argument("model")
        p.set_defaults(func=cmd_pin)

    p = sub.add_parser("drain", help="drain a node: no new preloads; its replicas with demand are loaded elsewhere "
                                     "first, then evicted, and its worker exits 0 (PREWARM_DRAIN_GRACE)")
    p.add_argument("node", help="the node's name (PREWARM_NODE of its worker, as `prewarm fleet` shows it)")
    p.add_argument("--wait", action="store_true", help="wait until the node's worker has left the fleet")
    p.add_argument("--timeout", type=arg_types.positive, default=600.0)
    p.add_argument("--reason", help="recorded in the event log")
    p.set_defaults(func=cmd_drain)
    p = sub.add_parser("undrain", help="undo a drain: the node takes new preloads again")
    p.add_argument("node")
    p.add_argument("--reason", help="recorded in the event log")
    p.set_defaults(func=cmd_drain)

    p = sub.add_parser("events", help="print the decision log")
    p.add_argument("--model")
    p.add_argument("--gpu")
    p.add_argument("--limit", type=arg_types.whole_at_least(1), default=50, help="the newest N events (default 50)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_events)
