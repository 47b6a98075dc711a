"""sentinels:// : TLS to the sentinels and to the master, with a password, for state and for the broker.

Real redis-servers and sentinels on TLS ports only (no plain port anywhere), a CA made with openssl, and a
real worker preloading a model through the broker over TLS found through the sentinels.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm import state
from prewarm.celery_app import PRELOAD, make_celery
from prewarm.runtime import connect
from prewarm.sentinel_cluster import SentinelCluster
from tests.model_files import tiny_catalog
from tests.procs import start_worker
from tests.system.test_redis_tls import _make_certs, _tls_capable

PASSWORD = "tls-sentinel-pw"


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    binary = next((b for b in ("/usr/bin/redis-server", "/usr/local/bin/redis-server")
                   if Path(b).exists() and _tls_capable(b)), None)
    if shutil.which("openssl") is None or binary is None:
        pytest.skip("needs openssl and a redis-server built with TLS (Debian's redis-server is)")
    certs = _make_certs(tmp_path)
    with SentinelCluster(password=PASSWORD, binary=binary, tls=certs) as c:
        yield c


def test_state_and_broker_through_sentinels_over_tls(tls_cluster: SentinelCluster, tmp_path: Path) -> None:
    url = tls_cluster.url
    assert url.startswith("sentinels://")
    r = connect(url)
    assert r.ping() and r.set("k", "v") and r.get("k") == b"v"
    assert r.connection_pool.get_master_address()[1] == tls_cluster.master_port()
    catalog = tiny_catalog(tmp_path / "models", ["tiny-mlp"])
    w = start_worker(url, catalog, devices="cpu:0=128MiB", node="node-stls", log_dir=tmp_path)
    try:
        res = make_celery(url).send_task(PRELOAD, args=["tiny-mlp", "v1"], queue=w.queues["node-stls/cpu:0"])
        assert res.get(timeout=60)["state"] == "ready"
        assert [x.model for x in state.read_fleet(r).replicas()] == ["tiny-mlp"]
        assert PASSWORD not in w.log()
    finally:
        w.stop()
        r.close()
