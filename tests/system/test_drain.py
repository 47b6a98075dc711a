"""Draining a node (issue 27, item 5) with real processes: Redis, two workers (node-a, node-b), the scheduler and
web (gunicorn). A pinned model on node-a is loaded on node-b before it leaves node-a (make-before-break) and
every route lookup meanwhile answers `ready`; node-a takes no new preload while it drains; its worker evicts
its replicas and exits 0. The same from the API (admin token) and from SIGTERM, and `undrain` undoes one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from prewarm import events, keys, state
from tests.model_files import tiny_catalog
from tests.procs import WorkerProc, wait_for, worker_factory  # noqa: F401  (fixture)
from tests.scheduler_procs import SchedulerProc
from tests.system.test_worker_process import _cli, size_of
from tests.web_support import WebProc

pytestmark = pytest.mark.slow

ADMIN = "drain-admin-token-0123456789"
A, B = "node-a/cpu:0", "node-b/cpu:0"


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    cat = tiny_catalog(tmp_path / "models", ["tiny-mlp", "tiny-lm"])
    text = cat.read_text()
    head = 'id = "tiny-mlp"\nversion = "v1"'
    assert head in text
    cat.write_text(text.replace(head, f"{head}\npinned = true", 1))
    return cat


@pytest.fixture
def admin_web(redis_url: str, catalog: Path, tmp_path: Path) -> Iterator[WebProc]:
    w = WebProc(redis_url, catalog, tmp_path, workers=1, env={"PREWARM_ADMIN_TOKEN": ADMIN})
    yield w
    w.stop()


def _scheduler(redis_url: str, catalog: Path, tmp_path: Path) -> SchedulerProc:
    # Nothing loaded without demand: the only replicas are the pinned model's and the ones a test asks for.
    return SchedulerProc(redis_url, catalog, tmp_path, env={"PREWARM_IDLE_MEMORY_BUDGET": "0"})


def ready_on(r: redis.Redis, model: str) -> list[str]:
    return sorted(g.id for g in state.read_fleet(r).alive() for x in g.replicas
                  if x.model == model and x.state == "ready")


def _route(web: WebProc, model: str) -> dict:
    # retry=1: a poll, not a request (no traffic counted); the answer lists every replica
    return requests.get(f"{web.url}/hooks/route", params={"model": model, "retry": "1"}, timeout=10).json()


def _slow_worker(worker_factory, catalog: Path, node: str, seconds: float) -> WorkerProc:  # noqa: F811, ANN001
    """A worker whose loads of tiny-mlp take about `seconds`: the drain is under way that long, ample time for
    the checks made while it drains (a few CLI and HTTP calls)."""
    pace = int(size_of(catalog, "tiny-mlp") / seconds)
    return worker_factory(catalog, devices="cpu:0=256MiB", node=node, env={"PREWARM_LOAD_PACE_BYTES_PER_S": str(pace)})


def test_a_drain_moves_the_pinned_model_before_it_leaves_and_the_worker_exits_0(
        redis_url, r, catalog, admin_web, schedulers, tmp_path, worker_factory) -> None:  # noqa: F811
    wa = worker_factory(catalog, devices="cpu:0=256MiB", node="node-a")
    schedulers.append(_scheduler(redis_url, catalog, tmp_path))
    wait_for(lambda: ready_on(r, "tiny-mlp") == [A], 60, what="tiny-mlp ready on node-a (pinned)", log=wa.log)
    wb = _slow_worker(worker_factory, catalog, "node-b", 20.0)

    p = _cli(redis_url, catalog, "drain", "node-c")
    assert p.returncode == 2 and "node 'node-c' is not in the fleet" in p.stderr and "node-a" in p.stderr, p.stderr
    p = _cli(redis_url, catalog, "drain", "node-a")
    assert p.returncode == 0 and "node-a draining" in p.stdout, p.stdout + p.stderr
    p = _cli(redis_url, catalog, "drain", "node-a")  # twice: changes nothing, says so
    assert p.returncode == 0 and "draining already" in p.stdout, p.stdout + p.stderr
    assert len(events.read(r, kind="drain")) == 1

    # While it drains: no new preload goes to node-a, named or placed; its gauge says draining.
    g = state.read_fleet(r).gpu(A)
    assert g is not None and g.draining and g not in state.read_fleet(r).placeable()
    p = _cli(redis_url, catalog, "preload", "tiny-lm", "--gpu", A)
    assert p.returncode == 2 and "node node-a is draining" in p.stderr, p.stderr
    p = _cli(redis_url, catalog, "preload", "tiny-lm")
    assert p.returncode == 0 and f"queued on {B}" in p.stdout, p.stdout + p.stderr
    metrics = requests.get(f"{admin_web.url}/metrics", timeout=10).text
    assert 'prewarm_node_draining{node="node-a"} 1.0' in metrics and 'prewarm_node_draining{node="node-b"} 0.0' in metrics

    states: list[str] = []
    while wa.alive():
        states.append(_route(admin_web, "tiny-mlp")["state"])
        time.sleep(0.05)
    assert wa.proc.wait(timeout=30) == 0, wa.log()[-3000:]
    assert states and set(states) == {"ready"}, f"not ready at some lookup: {sorted(set(states))}"
    assert ready_on(r, "tiny-mlp") == [B]

    # make-before-break: the replacement (kind "drain", by the scheduler) was ready on node-b before the
    # drain's evict of node-a's replica
    moved = [e for e in events.read(r, model="tiny-mlp", kind="preload") if e.numbers.get("kind") == "drain"]
    assert [(e.actor, e.gpu) for e in moved] == [("scheduler", B)], moved
    (evict,) = [e for e in events.read(r, model="tiny-mlp", kind="evict") if e.gpu == A]
    assert evict.numbers.get("kind") == "drain" and evict.actor == "worker"
    ready_b = [e.ts for e in events.read(r, model="tiny-mlp", kind="ready") if e.gpu == B]
    assert ready_b and min(ready_b) < evict.ts
    (done,) = events.read(r, kind="drained")
    assert done.gpu == "node-a" and done.numbers["evicted"] == 1
    assert all(e.model != "tiny-lm" or e.gpu != A for e in events.read(r, kind="preload"))
    assert wb.alive()


def test_the_api_drains_and_undrains_and_sigterm_drains(redis_url, r, catalog, admin_web, schedulers, tmp_path,
                                                        worker_factory) -> None:  # noqa: F811
    wa = worker_factory(catalog, devices="cpu:0=256MiB", node="node-a")
    schedulers.append(_scheduler(redis_url, catalog, tmp_path))
    wait_for(lambda: ready_on(r, "tiny-mlp") == [A], 60, what="tiny-mlp ready on node-a (pinned)", log=wa.log)
    _slow_worker(worker_factory, catalog, "node-b", 20.0)
    url = f"{admin_web.url}/api/nodes/node-a/drain"
    auth = {"Authorization": f"Bearer {ADMIN}"}

    assert requests.post(url, timeout=10).status_code == 401  # no admin token: refused, nothing changed
    assert requests.delete(url, timeout=10).status_code == 401
    assert not r.hexists(keys.DRAINING, "node-a")
    bad = requests.post(f"{admin_web.url}/api/nodes/node-c/drain", headers=auth, timeout=10)
    assert bad.status_code == 404 and "not in the fleet" in bad.json()["error"], bad.text
    assert requests.delete(f"{admin_web.url}/api/nodes/node-c/drain", headers=auth, timeout=10).status_code == 404

    first = requests.post(url, headers=auth, json={"reason": "kernel upgrade"}, timeout=10)
    assert first.status_code == 202 and first.json()["draining"] and first.json()["gpus"] == [A], first.text
    again = requests.post(url, headers=auth, timeout=10)
    assert again.status_code == 200 and not again.json()["new"]
    (ev,) = events.read(r, kind="drain")
    assert ev.actor == "operator" and ev.reason == "kernel upgrade"
    fleet_page = requests.get(f"{admin_web.url}/api/fleet", timeout=10).json()
    assert next(n for n in fleet_page["by_node"] if n["node"] == "node-a")["drain"]["state"] == "draining"

    # undone while node-b still loads the replacement: node-a serves on and takes loads again
    wait_for(lambda: any(e.numbers.get("kind") == "drain" for e in events.read(r, kind="preload")), 30,
             what="the drain's replacement preload", log=schedulers[0].log)
    undo = requests.delete(url, headers=auth, timeout=10)
    assert undo.status_code == 200 and undo.json()["undone"], undo.text
    assert requests.delete(url, headers=auth, timeout=10).json()["undone"] is False  # not draining: nothing to undo
    assert [e.actor for e in events.read(r, kind="undrain")] == ["operator"]
    time.sleep(2.0)  # several worker polls: it saw the undrain and did not evict
    assert wa.alive() and A in ready_on(r, "tiny-mlp")
    assert A in [g.id for g in state.read_fleet(r).placeable()]
    assert not events.read(r, kind="drained")

    # SIGTERM: the worker drains its node itself, then exits 0
    assert wa.stop(timeout=60) == 0, wa.log()[-3000:]
    drains = events.read(r, kind="drain")
    assert drains[0].actor == "worker" and "SIGTERM" in drains[0].reason
    (done,) = events.read(r, kind="drained")
    assert done.gpu == "node-a"
    assert ready_on(r, "tiny-mlp") == [B]
    (evict,) = [e for e in events.read(r, model="tiny-mlp", kind="evict") if e.gpu == A]
    assert evict.numbers.get("kind") == "drain"
    ready_b = [e.ts for e in events.read(r, model="tiny-mlp", kind="ready") if e.gpu == B]
    assert ready_b and min(ready_b) < evict.ts
