"""The operator CLI says what really happened (issue 17, findings 5, 7 and 8), run as a real process against
a real worker and Redis:

- an evict of a model that is still loading cancels the load, and says so; a refused action exits non-zero
  naming the action that was refused and the one in flight;
- `preload --wait` reports this attempt's outcome, not an earlier attempt's `failed` record;
- Redis down, or refusing the password: one readable line naming the URL (never the password), no traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from prewarm import celery_app, events, keys, state
from prewarm.dispatch import Dispatcher
from prewarm.redis_server import EmbeddedRedis, free_port
from tests import procs
from tests.model_files import model_files, reshape_tensor, tiny_catalog
from tests.procs import REPO, wait_for
from tests.system.test_worker_process import _cli, gpu, rep, size_of

worker_factory = procs.worker_factory  # the fixture, used by name


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "models", ["tiny-lm", "tiny-mlp", "tiny-lm-wide"])


@pytest.fixture
def celery(redis_url: str) -> Iterator[Celery]:
    app = celery_app.make_celery(redis_url)
    yield app
    app.close()


def test_evict_while_loading_cancels_the_load_and_a_refusal_exits_non_zero(r: redis.Redis, redis_url: str,
                                                                          catalog: Path, worker_factory) -> None:
    size = size_of(catalog, "tiny-lm-wide")
    w = worker_factory(catalog, devices="cpu:0=64MiB",
                       env={"PREWARM_LOAD_PACE_BYTES_PER_S": str(int(size / 300))})  # a 5-minute load
    gid = "node-a/cpu:0"
    p = _cli(redis_url, catalog, "preload", "tiny-lm-wide")
    assert p.returncode == 0, p.stderr
    wait_for(lambda: (x := rep(r, gid, "tiny-lm-wide")) and x.state == "loading", 20, what="loading", log=w.log)

    # A second preload while it loads is refused, in words that name both actions.
    p = _cli(redis_url, catalog, "preload", "tiny-lm-wide", "--gpu", "cpu:0")
    assert p.returncode != 0
    assert "preload of tiny-lm-wide@v1 on node-a/cpu:0 refused: preload of tiny-lm-wide@v1 (operator: " \
           "operator preload from the CLI) is in flight" in p.stderr, p.stderr

    # The evict cancels the load: the worker stops reading, frees what it allocated, the replica goes.
    p = _cli(redis_url, catalog, "evict", "tiny-lm-wide", "--wait", "--timeout", "30")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "evict of tiny-lm-wide queued on node-a/cpu:0; it cancels the preload of tiny-lm-wide@v1" in p.stdout
    assert "tiny-lm-wide@v1 evicted from node-a/cpu:0" in p.stdout
    assert rep(r, gid, "tiny-lm-wide") is None
    wait_for(lambda: gpu(r, gid).used_bytes == 0, 10, what="the load's bytes to be released", log=w.log)
    (failed,) = events.read(r, kind="failed", model="tiny-lm-wide")
    assert failed.numbers["cancelled"] and "evicted while loading" in failed.reason
    wait_for(lambda: not r.exists(keys.intent("tiny-lm-wide", gid)), 10, what="the evict to release its intent")
    assert w.alive()


def test_evict_refused_by_an_evict_in_flight_exits_non_zero(r: redis.Redis, redis_url: str, celery: Celery,
                                                           catalog: Path) -> None:
    # No worker consumes the queue, so the first evict stays in flight.
    g = state.Gpu(id="node-a/cpu:0", node="node-a", device="cpu:0", queue=state.queue_name("node-a", "cpu:0"),
                  total_bytes=2**26, used_bytes=0, free_bytes=2**26, last_heartbeat=0.0)
    rec = state.Replica("tiny-mlp", "v1", g.id, "ready")
    state.write_heartbeat(r, g, [rec], ttl=60)
    assert Dispatcher(r, celery).evict("tiny-mlp", "v1", g, actor="scheduler", reason="cold for an hour").sent
    p = _cli(redis_url, catalog, "evict", "tiny-mlp")
    assert p.returncode != 0
    assert "evict of tiny-mlp@v1 on node-a/cpu:0 refused: evict of tiny-mlp@v1 (scheduler: cold for an hour) " \
           "is in flight" in p.stderr, p.stderr


def test_preload_wait_reports_this_attempt_not_an_earlier_failure(r: redis.Redis, redis_url: str, celery: Celery,
                                                                  catalog: Path, worker_factory) -> None:
    wide = size_of(catalog, "tiny-lm-wide")
    # One worker thread: while it loads one model (paced to a few seconds), the next task waits in the broker.
    w = worker_factory(catalog, devices="cpu:0=64MiB,cpu:1=64MiB", threads=1,
                       env={"PREWARM_LOAD_PACE_BYTES_PER_S": str(int(wide / 4))})
    f = model_files(catalog, "tiny-lm")[0]
    good = f.read_bytes()
    reshape_tensor(f, "tok.weight")  # a valid file that no longer matches its builder
    p = _cli(redis_url, catalog, "preload", "tiny-lm", "--gpu", "cpu:0", "--wait", "--timeout", "60")
    assert p.returncode != 0 and "failed" in p.stderr, p.stdout + p.stderr
    assert rep(r, "node-a/cpu:0", "tiny-lm").state == "failed"  # listed for a while (failed_retention)
    f.write_bytes(good)  # fixed

    busy = Dispatcher(r, celery).preload("tiny-lm-wide", "v1", gpu(r, "node-a/cpu:1"), actor="operator",
                                         reason="keeps the only thread busy")
    wait_for(lambda: (x := rep(r, "node-a/cpu:1", "tiny-lm-wide")) and x.state == "loading", 20, what="loading",
             log=w.log)
    # The earlier failure is still listed when this preload starts waiting: it must not be taken for this one.
    p = _cli(redis_url, catalog, "preload", "tiny-lm", "--gpu", "cpu:0", "--wait", "--timeout", "60")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "tiny-lm@v1 ready on node-a/cpu:0" in p.stdout
    assert rep(r, "node-a/cpu:0", "tiny-lm").state == "ready"
    assert celery.AsyncResult(busy.task_id).get(timeout=60)["state"] == "ready"


def _cli_bg(redis_url: str, catalog: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    e.update({"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PYTHONPATH": str(REPO)}, **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "prewarm.programs.cli", *args], env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(REPO))


def test_preload_wait_outlasts_a_heartbeat_that_lapses_for_a_moment(r: redis.Redis, redis_url: str, catalog: Path,
                                                                   worker_factory) -> None:
    """A worker starved of CPU for a TTL (SIGSTOP here; TTL 3 s) lets its GPU's record expire, and its load goes
    on when it resumes. `preload --wait` waits through the lapse and reports the load: the GPU has left only
    once it stays away for the CLI's PREWARM_HEARTBEAT_TTL (10 s by default). Ending the wait at the first
    read without the GPU made the LiteLLM module's setup fail once on a busy machine."""
    wide = size_of(catalog, "tiny-lm-wide")
    w = worker_factory(catalog, devices="cpu:0=64MiB", env={"PREWARM_LOAD_PACE_BYTES_PER_S": str(int(wide / 6))})
    gid = "node-a/cpu:0"
    p = _cli_bg(redis_url, catalog, "preload", "tiny-lm-wide", "--gpu", "cpu:0", "--wait", "--timeout", "120")
    wait_for(lambda: (x := rep(r, gid, "tiny-lm-wide")) and x.state == "loading", 30, what="loading", log=w.log)
    os.kill(w.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: procs.gpu_gone(redis_url, gid), 30, what="the stopped worker's GPU record to expire")
        time.sleep(1.0)  # the waiting CLI reads the fleet every 0.2 s: let it find the GPU missing
    finally:
        os.kill(w.pid, signal.SIGCONT)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, out + err + w.log()[-3000:]
    assert "tiny-lm-wide@v1 ready on node-a/cpu:0" in out
    assert rep(r, gid, "tiny-lm-wide").state == "ready"


def test_preload_wait_ends_when_the_worker_dies(r: redis.Redis, redis_url: str, catalog: Path,
                                                worker_factory) -> None:
    """The other side of the grace: a worker killed mid-load never comes back, and the wait ends non-zero with
    the reason once the GPU has stayed away for the CLI's heartbeat TTL (3 s here), well before its timeout."""
    wide = size_of(catalog, "tiny-lm-wide")
    w = worker_factory(catalog, devices="cpu:0=64MiB", env={"PREWARM_LOAD_PACE_BYTES_PER_S": str(int(wide / 300))})
    gid = "node-a/cpu:0"
    p = _cli_bg(redis_url, catalog, "preload", "tiny-lm-wide", "--gpu", "cpu:0", "--wait", "--timeout", "600",
                env={"PREWARM_HEARTBEAT_TTL": "3"})
    wait_for(lambda: (x := rep(r, gid, "tiny-lm-wide")) and x.state == "loading", 30, what="loading", log=w.log)
    w.kill()
    out, err = p.communicate(timeout=120)  # far less than the CLI's own 600 s timeout
    assert p.returncode != 0, out + err
    assert "preload of tiny-lm-wide@v1 on node-a/cpu:0 failed: GPU node-a/cpu:0 left the fleet while waiting " \
           "(no heartbeat for 3 s)" in err, err


def _one_line(p) -> str:  # noqa: ANN001
    assert p.returncode != 0
    assert "Traceback" not in p.stderr and p.stdout == "", p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.mark.parametrize("args", [("fleet",), ("preload", "tiny-mlp"), ("events",)])
def test_cli_with_redis_down_says_so_in_one_line(catalog: Path, args: tuple[str, ...]) -> None:
    port = free_port()  # nothing listens there
    line = _one_line(_cli(f"redis://:hunter2@127.0.0.1:{port}/0", catalog, *args, timeout=120))
    assert line.startswith(f"prewarm: cannot reach Redis at redis://:***@127.0.0.1:{port}/0 (")
    assert "check PREWARM_REDIS_URL" in line and "hunter2" not in line


def test_cli_with_a_wrong_password_says_so_in_one_line(catalog: Path) -> None:
    port = free_port()
    with EmbeddedRedis(port=port, extra_args=["--requirepass", "right-one"],
                       client_url=f"redis://:right-one@127.0.0.1:{port}/0"):
        for url in (f"redis://:wrong-one@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
            line = _one_line(_cli(url, catalog, "fleet"))
            assert line.startswith("prewarm: Redis at redis://") and "refused the login" in line, line
            assert "check the password" in line and "wrong-one" not in line and "right-one" not in line
        ok = _cli(f"redis://:right-one@127.0.0.1:{port}/0", catalog, "fleet", "--json")
        assert ok.returncode == 0, ok.stderr
