"""A throwaway Redis Sentinel setup on loopback, for the failover test and `prewarm bench failover`.

    with SentinelCluster() as c:     # a master, one replica, three sentinels (quorum 2, down after 1 s)
        c.url                        # sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/prewarm/0
        old = c.kill_master()        # SIGKILL of the master's process (kill -9)
        seconds = c.wait_failover(old)   # until the sentinels name a new master that answers as one
        c.restart(old)               # back on its port; the sentinels make it a replica of the new master

Real processes: `redis-server` for the data nodes, `redis-server sentinel.conf --sentinel` for the
sentinels (Debian's redis-server package runs Sentinel this way), each in its own temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from prewarm.redis_server import free_port, redis_server_binary

MASTER_NAME = "prewarm"


class _Proc:
    def __init__(self, args: list[str], port: int, directory: Path, password: str | None = None,
                 ca: Path | None = None) -> None:
        self.args, self.port, self.dir, self.password, self.ca = args, port, directory, password, ca
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True, cwd=str(self.dir))
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.args[0]} on port {self.port} did not start; see {self.dir}")
            time.sleep(0.05)

    def client(self, timeout: float = 1.0) -> redis.Redis:
        tls = {"ssl": True, "ssl_ca_certs": str(self.ca)} if self.ca else {}
        return redis.Redis(port=self.port, password=self.password, socket_timeout=timeout,
                           socket_connect_timeout=timeout, **tls)

    def answers(self) -> bool:
        try:
            with contextlib.closing(self.client(0.5)) as c:
                return bool(c.ping())
        except redis.RedisError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()


class SentinelCluster:
    def __init__(self, *, replicas: int = 1, sentinels: int = 3, quorum: int = 2, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 5000, password: str | None = None,
                 tls: dict[str, Path] | None = None, binary: str | None = None) -> None:
        """`tls`: {"cert", "key", "ca"} files: every node and sentinel on TLS only (replication and the
        sentinels' links too), and `url` is sentinels://."""
        self.binary = binary or redis_server_binary()
        self.tls = tls
        self.root = Path(tempfile.mkdtemp(prefix="prewarm-sentinel-"))
        self.password = password
        self.quorum, self.down_after_ms, self.failover_timeout_ms = quorum, down_after_ms, failover_timeout_ms
        self.nodes: list[_Proc] = []
        for i in range(1 + replicas):
            self.nodes.append(self._node(i))
        self.sentinels: list[_Proc] = []
        self._n_sentinels = sentinels

    def _node(self, i: int) -> _Proc:
        port = free_port()
        d = self.root / f"redis-{i}"
        d.mkdir()
        args = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(d), "--logfile", str(d / "redis.log")]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        if self.tls:
            args += ["--port", "0", "--tls-port", str(port), *self._tls_args("--")]
        if i:
            args += ["--replicaof", "127.0.0.1", str(self.nodes[0].port)]
        return _Proc(args, port, d, self.password, self.tls["ca"] if self.tls else None)

    def _tls_args(self, dash: str) -> list[str]:
        assert self.tls is not None
        return [f"{dash}tls-cert-file", str(self.tls["cert"]), f"{dash}tls-key-file", str(self.tls["key"]),
                f"{dash}tls-ca-cert-file", str(self.tls["ca"]), f"{dash}tls-auth-clients", "no",
                f"{dash}tls-replication", "yes"]

    def _sentinel(self, i: int, master_port: int) -> _Proc:
        port = free_port()
        d = self.root / f"sentinel-{i}"
        d.mkdir()
        conf = d / "sentinel.conf"  # Sentinel rewrites its own config file: each one its own
        lines = [f"port {port}", "bind 127.0.0.1", f"dir {d}", f"logfile {d / 'sentinel.log'}",
                 f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {self.quorum}",
                 f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
                 f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}",
                 f"sentinel parallel-syncs {MASTER_NAME} 1"]
        if self.password:
            lines.append(f"sentinel auth-pass {MASTER_NAME} {self.password}")
        if self.tls:
            t = self._tls_args("")
            lines[0] = f"port 0\ntls-port {port}"
            lines += [f"{t[k]} {t[k + 1]}" for k in range(0, len(t), 2)]
        conf.write_text("\n".join(lines) + "\n")
        return _Proc([self.binary, str(conf), "--sentinel"], port, d, ca=self.tls["ca"] if self.tls else None)

    @property
    def url(self) -> str:
        cred = f":{self.password}@" if self.password else ""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        if self.tls:
            return f"sentinels://{cred}{hosts}/{MASTER_NAME}/0?ssl_ca_certs={self.tls['ca']}"
        return f"sentinel://{cred}{hosts}/{MASTER_NAME}/0"

    def start(self) -> SentinelCluster:
        for n in self.nodes:
            n.start()
        self.wait_replicas_in_sync()
        self.sentinels = [self._sentinel(i, self.nodes[0].port) for i in range(self._n_sentinels)]
        for s in self.sentinels:
            s.start()
        self.wait(lambda: all(self._sees_replicas(s) for s in self.sentinels), 30, "the sentinels to see the replica")
        return self

    def _sees_replicas(self, s: _Proc) -> bool:
        try:
            with contextlib.closing(s.client()) as c:
                replicas = c.sentinel_slaves(MASTER_NAME)
                others = c.sentinel_sentinels(MASTER_NAME)
        except redis.RedisError:
            return False
        up = [x for x in replicas if "s_down" not in x.get("flags", "") and x.get("master-link-status") == "ok"]
        return len(up) >= len(self.nodes) - 1 and len(others) >= len(self.sentinels) - 1

    @staticmethod
    def wait(cond: Callable[[], object], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.05)

    def master_port(self) -> int | None:
        """The master's port as the sentinels name it (the first one that answers)."""
        for s in self.sentinels:
            try:
                with contextlib.closing(s.client()) as c:
                    addr = c.sentinel_get_master_addr_by_name(MASTER_NAME)
            except redis.RedisError:
                continue
            if addr:
                return int(addr[1])
        return None

    def node(self, port: int) -> _Proc:
        return next(n for n in self.nodes if n.port == port)

    def master(self) -> _Proc:
        port = self.master_port()
        if port is None:
            raise RuntimeError("no sentinel names a master")
        return self.node(port)

    def kill_master(self) -> _Proc:
        """kill -9 of the master's process; returns it (for wait_failover and restart)."""
        m = self.master()
        m.kill()
        return m

    def wait_failover(self, old: _Proc, timeout: float = 60.0) -> float:
        """Seconds from now until the sentinels name another master and it answers as a master."""
        started = time.monotonic()

        def elected() -> bool:
            port = self.master_port()
            if port is None or port == old.port:
                return False
            try:
                with contextlib.closing(self.node(port).client()) as c:
                    return c.role()[0] in (b"master", "master")
            except redis.RedisError:
                return False

        self.wait(elected, timeout, "the sentinels to elect a new master")
        return time.monotonic() - started

    def restart(self, old: _Proc, timeout: float = 60.0) -> None:
        """Start a killed node again on its port (no data: it kept none) as a replica of the new master, and
        wait until it is in sync and the sentinels see it, so the next failover has somewhere to go."""
        if "--replicaof" in old.args:
            i = old.args.index("--replicaof")
            del old.args[i:i + 3]
        master = self.master_port()
        # Started as the new master's replica at once (the sentinels would convert it too, but only after
        # they notice it is back): the next failover then has an in-sync replica to promote.
        old.args += ["--replicaof", "127.0.0.1", str(master)]
        old.start()
        self.wait(lambda: self._replica_in_sync(old), timeout, f"127.0.0.1:{old.port} to rejoin as a replica")
        self.wait(lambda: all(self._sees_replicas(s) for s in self.sentinels), timeout,
                  "the sentinels to see every replica up")

    def _replica_in_sync(self, node: _Proc) -> bool:
        try:
            with contextlib.closing(node.client()) as c:
                info = c.info("replication")
        except redis.RedisError:
            return False
        return info.get("role") == "slave" and info.get("master_link_status") == "up" \
            and not info.get("master_sync_in_progress")

    def wait_replicas_in_sync(self, timeout: float = 30.0) -> None:
        for n in self.nodes[1:]:
            self.wait(lambda n=n: self._replica_in_sync(n), timeout, f"replica 127.0.0.1:{n.port} to sync")

    def stop(self) -> None:
        for p in [*self.sentinels, *self.nodes]:
            p.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SentinelCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def available() -> bool:
    """Whether this machine can run a cluster (a redis-server that runs Sentinel: any real one does)."""
    try:
        return os.path.exists(redis_server_binary())
    except RuntimeError:
        return False
