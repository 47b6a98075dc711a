"""A Sentinel failover under load loses nothing that was accepted, and nobody restarts anything.

Real processes on loopback: a Redis master, two replicas and three sentinels (quorum 2, down after 1 s);
`prewarm web`, two `prewarm scheduler`s and a `prewarm worker`, all on the sentinel:// URL. Hook traffic
flows and an operator's preload is loading when the master gets `kill -9`. Afterwards: the worker is the
same process, every hook event answered 202 is counted, the preload's model is ready, one scheduler leads,
and no model has a replica on two GPUs.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm import events, keys, state
from prewarm.config import Settings
from prewarm.context import Context
from prewarm.dispatch import order_preload
from prewarm.domain import states as rs
from prewarm.runtime import connect
from prewarm.sentinel_cluster import SentinelCluster, available
from tests.model_files import tiny_catalog
from tests.procs import start_worker, wait_for
from tests.scheduler_procs import SchedulerProc
from tests.web_support import WebProc

pytestmark = pytest.mark.skipif(not available(), reason="needs redis-server (it runs Sentinel too)")

HOT = "tiny-mlp"  # hook traffic
LOADED = "tiny-lm-wide"  # the preload in flight at the kill


@pytest.fixture
def cluster() -> Iterator[SentinelCluster]:
    # two replicas: after the failover one is left to confirm the hook's writes (PREWARM_REDIS_WAIT_REPLICAS=1)
    with SentinelCluster(replicas=2) as c:
        yield c


class Traffic(threading.Thread):
    """Single hook events for HOT as fast as the web answers; counts what was answered 202."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port, self.accepted, self.refused, self.stop = port, 0, 0, threading.Event()

    def run(self) -> None:
        body = json.dumps({"model": HOT}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        while not self.stop.is_set():
            try:
                conn.request("POST", "/hooks/requests", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                if resp.status == 202:
                    self.accepted += 1
                else:
                    assert resp.status == 503 and resp.getheader("Retry-After"), resp.status
                    self.refused += 1
                    self.stop.wait(0.05)
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                self.stop.wait(0.05)
        conn.close()


def test_a_failover_loses_nothing_accepted(cluster: SentinelCluster, tmp_path: Path) -> None:
    url = cluster.url
    catalog = tiny_catalog(tmp_path / "models", [HOT, LOADED])
    size = sum(f.stat().st_size for f in (tmp_path / "models" / f"{LOADED}-v1").rglob("*") if f.is_file())
    worker = start_worker(url, catalog, devices="cpu:0=256MiB,cpu:1=256MiB", node="node-f", log_dir=tmp_path,
                          env={"PREWARM_LOAD_PACE_BYTES_PER_S": str(int(size / 8))})  # an 8 s load
    web = WebProc(url, catalog, tmp_path, workers=1, env={"PREWARM_REDIS_WAIT_REPLICAS": "1"})
    env = {"PREWARM_HEARTBEAT_TTL": "3"}
    schedulers = [SchedulerProc(url, catalog, tmp_path / f"s{i}", env=env) for i in range(2)]
    traffic = Traffic(web.port)
    r = connect(url)
    try:
        wait_for(lambda: any(s.is_leader() for s in schedulers), 60, what="a leader")
        traffic.start()
        wait_for(lambda: traffic.accepted > 20, 30, what="hook traffic")
        settings = Settings.from_env({"PREWARM_REDIS_URL": url, "PREWARM_CATALOG": str(catalog)})
        ctx = Context(settings)
        gpu = state.read_fleet(r).gpu("node-f/cpu:1")
        assert gpu is not None
        # The operator's preload, unless the scheduler's own fill of the free memory already sent one
        [sent] = ctx.dispatcher.send_many([order_preload(LOADED, "v1", gpu, actor="operator", reason="test")])
        assert not isinstance(sent, Exception) and (sent.sent or sent.held is not None), sent
        wait_for(lambda: any(x.model == LOADED and x.state == rs.LOADING for x in state.read_fleet(r).replicas()),
                 60, what="the preload to be loading", log=worker.log)
        pid = worker.pid

        old = cluster.kill_master()  # kill -9
        cluster.wait_failover(old)
        wait_for(lambda: traffic.accepted > 0 and _answers(r), 30, what="Redis through the new master")
        before = traffic.accepted
        wait_for(lambda: traffic.accepted > before + 20, 60, what="hooks answered 202 again", log=web.log)

        wait_for(lambda: any(x.model == LOADED and x.state == rs.READY for x in state.read_fleet(r).replicas()),
                 90, what=f"{LOADED} ready after the failover", log=worker.log)
        traffic.stop.set()
        traffic.join(10)

        assert worker.alive() and worker.pid == pid, worker.log()[-3000:]
        wait_for(worker.heartbeating, 30, what="the same worker heartbeating on the new master", log=worker.log)
        assert "Unrecoverable error" not in worker.log()
        counted = int(r.hget(keys.REQUESTS_TOTAL, HOT) or 0)
        assert counted >= traffic.accepted, (counted, traffic.accepted)  # every 202 recorded
        leaders = {s.ident for s in schedulers if s.is_leader()}
        assert len(leaders) == 1, leaders
        wait_for(lambda: _one_leader_for_a_while(r, schedulers), 30, what="one steady leader")
        by_model: dict[str, set[str]] = {}
        for x in state.read_fleet(r).replicas():
            by_model.setdefault(x.model, set()).add(x.gpu)
        assert all(len(gpus) == 1 for gpus in by_model.values()), by_model
        kinds = [e.kind for e in events.read(r, limit=500)]
        assert "failover" in kinds, kinds
    finally:
        traffic.stop.set()
        for s in schedulers:
            s.stop()
        web.stop()
        worker.stop()
        r.close()


def _answers(r: object) -> bool:
    with contextlib.suppress(Exception):
        return bool(r.ping())  # type: ignore[attr-defined]
    return False


def _one_leader_for_a_while(r: object, schedulers: list[SchedulerProc]) -> bool:
    import time

    holders = set()
    for _ in range(10):
        holders.add(r.get(keys.LEADER_LOCK))  # type: ignore[attr-defined]
        time.sleep(0.1)
    return len(holders) == 1 and next(iter(holders)) in {s.ident.encode() for s in schedulers}
