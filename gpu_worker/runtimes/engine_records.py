"""A file per engine process a worker started, so the worker's next incarnation stops what this one left.

The launcher (engine_launcher.py) takes its engine down when the worker dies (the kernel's parent-death
signal, and a parent check every second). That covers a SIGKILLed worker, but not everything: a launcher
that was itself killed (worker and launcher SIGKILLed together), or a kernel without prctl, leaves the
engine running and holding its GPU's memory and port. So each engine is also written down here when it
starts and crossed out once its release verified it gone; a worker that claims a GPU
(heartbeat.claim_gpus) stops every engine still recorded for that GPU, and verifies it gone, before it
announces the GPU (and its memory as free).

One directory per GPU under the data dir (`$PREWARM_DATA_DIR/engines/<node>__<device>/<engine id>.json`).
A record names the launcher (pid, its start time), the engine's process group and port, and an id the
engine's processes carry in their environment (PREWARM_ENGINE_ID). The process group is what finds the
engine: the worker starts the launcher with start_new_session, so the launcher leads a session and a
group that every process of the engine stays in (vLLM's engine core and workers included), whatever they
rename themselves to; a process that makes a group of its own (setpgrp) stays in the session, which is
what is searched. The environment id is a second net for a process that left the session; it cannot be
the first, since vLLM's renamed processes (setproctitle) overwrite what /proc/<pid>/environ shows.

Only the engine's processes are signalled: a session's number stays taken (the kernel does not reuse it)
while any process is in the session, so a live process with that number and another start time means the
engine's session is gone; members must also have started after the launcher (true of every process of
the engine: a cheap check against a wrong record); and psutil signals a process only if its pid still
names the process that was found.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger("prewarm.worker")

ENGINE_ID_ENV = "PREWARM_ENGINE_ID"
CREATE_TIME_SLACK = 0.05  # seconds: psutil's start time is read from /proc at tick resolution
REAP_TERM_GRACE = 10.0  # seconds a leftover engine gets to stop on SIGTERM (freeing its GPU) before SIGKILL
REAP_KILL_TIMEOUT = 15.0  # seconds after SIGKILL until processes still there count as survivors
POLL_SECONDS = 0.1


class EngineLeftRunning(RuntimeError):
    """A previous worker's engine could not be stopped: its GPU's memory is not free."""


@dataclass(frozen=True)
class EngineRecord:
    engine_id: str
    gpu: str
    model: str
    version: str
    pid: int  # the launcher: the leader of the engine's process group
    create_time: float  # the launcher's start time (psutil), so a reused pid is not taken for it
    port: int
    worker_pid: int
    log: str = ""
    # The engine's process group, also its session (start_new_session: both the launcher's pid); 0 in a
    # record written before it was recorded (the launcher's pid, then).
    pgid: int = 0

    @property
    def group(self) -> int:
        return self.pgid or self.pid

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> EngineRecord:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


def _safe(gpu: str) -> str:
    return gpu.replace("/", "__").replace(":", "_")


class EngineRecords:
    """The engine records under `root` (the data dir's `engines/`)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def _dir(self, gpu: str) -> Path:
        return self.root / _safe(gpu)

    def add(self, rec: EngineRecord) -> None:
        d = self._dir(rec.gpu)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{rec.engine_id}.tmp"
        tmp.write_text(json.dumps(asdict(rec)))
        os.replace(tmp, d / f"{rec.engine_id}.json")  # never a half-written record

    def remove(self, gpu: str, engine_id: str) -> None:
        try:
            (self._dir(gpu) / f"{engine_id}.json").unlink()
        except FileNotFoundError:
            pass

    def records(self, gpu: str) -> list[EngineRecord]:
        out = []
        for f in sorted(self._dir(gpu).glob("*.json")):
            try:
                out.append(EngineRecord.from_json(json.loads(f.read_text())))
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning("unreadable engine record %s (%s): removed", f, exc)
                f.unlink(missing_ok=True)
        return out

    def reap(self, gpu: str, *, grace: float = REAP_TERM_GRACE,
             timeout: float = REAP_KILL_TIMEOUT) -> list[tuple[EngineRecord, str]]:
        """Stop every engine recorded for `gpu` (SIGTERM to its processes, SIGKILL after `grace` seconds),
        verify they are gone and drop the records; returns each record with a line saying what was found.
        A record whose processes survive SIGKILL for `timeout` seconds is kept."""
        said: list[tuple[EngineRecord, str]] = []
        for rec in self.records(gpu):
            stopped, left = stop_engine(rec, grace=grace, timeout=timeout)
            what = f"engine {rec.engine_id} of {rec.model}@{rec.version} (group {rec.group}, port {rec.port}"
            if left:
                said.append((rec, f"{what}): processes {', '.join(str(p.pid) for p in left)} survived SIGKILL; "
                                  "record kept"))
                continue
            self.remove(gpu, rec.engine_id)
            done = (f"stopped {len(stopped)} leftover process(es) ({', '.join(map(str, sorted(stopped)))})"
                    if stopped else "already gone")
            said.append((rec, f"{what}, worker pid {rec.worker_pid}): {done}{port_note(rec.port)}"))
        return said


def stop_engine(rec: EngineRecord, *, grace: float, timeout: float) -> tuple[set[int], list[psutil.Process]]:
    """SIGTERM each process of the engine once (vLLM shuts down and frees its GPU), SIGKILL what is left
    after `grace`; the processes are looked up again at each step (one the engine started meanwhile is
    caught too). Returns the pids signalled and what is still running `timeout` s after SIGKILL."""
    start = time.monotonic()
    termed: set[int] = set()
    while True:
        procs = engine_processes(rec)
        elapsed = time.monotonic() - start
        if not procs or elapsed > grace + timeout:
            return termed | {p.pid for p in procs}, procs
        kill = elapsed > grace
        for p in procs:
            if kill or p.pid not in termed:
                _signal(p, signal.SIGKILL if kill else signal.SIGTERM)
                termed.add(p.pid)
        time.sleep(POLL_SECONDS)


def engine_processes(rec: EngineRecord) -> list[psutil.Process]:
    """Live processes of the recorded engine: the launcher's session (see the module docstring for why
    only the engine's), then any other process whose environment carries the engine's id."""
    found = {p.pid: p for p in _session(rec)}
    for p in psutil.process_iter():
        if p.pid in found:
            continue
        try:
            if p.environ().get(ENGINE_ID_ENV) == rec.engine_id and p.status() != psutil.STATUS_ZOMBIE:
                found[p.pid] = p
        except psutil.Error:  # another user's process, or gone meanwhile
            continue
    return list(found.values())


def _session(rec: EngineRecord) -> list[psutil.Process]:
    """The live processes of the launcher's session: its group, and any group an engine process made of
    itself inside it (setpgrp, as vLLM's data-parallel supervisor does)."""
    try:
        if abs(psutil.Process(rec.group).create_time() - rec.create_time) > CREATE_TIME_SLACK:
            return []  # the number names another process now: the engine's session is gone
    except psutil.Error:
        pass  # the launcher is gone; its session may not be
    out = []
    for p in psutil.process_iter():
        try:
            if (os.getsid(p.pid) == rec.group and p.status() != psutil.STATUS_ZOMBIE
                    and p.create_time() >= rec.create_time - CREATE_TIME_SLACK):
                out.append(p)
        except (OSError, psutil.Error):
            continue
    return out


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (not zombie) processes of process group `pgid`."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on `port` now (as servers do, with SO_REUSEADDR: connections the
    engine closed linger in TIME_WAIT without holding the port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_note(port: int) -> str:
    """'' when no server listens on the engine's recorded port now, else who does: not the engine (its
    processes are gone), so it is left alone and only said (a new engine takes a free port anyway)."""
    if port <= 0 or port_is_free(port, "0.0.0.0"):
        return ""
    try:
        listening = [c for c in psutil.net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port]
    except psutil.Error:
        return ""
    if not listening:
        return ""  # a client's socket on that number (an ephemeral port): no server holds it
    pids = sorted({c.pid for c in listening if c.pid})
    who = f"pid {', '.join(map(str, pids))}" if pids else "another user's process"
    return f"; port {port} is held by {who}, not the engine's: left alone"


def _signal(p: psutil.Process, sig: signal.Signals) -> None:
    try:
        p.send_signal(sig)  # psutil refuses a pid that names another process by now
    except psutil.Error:
        pass
