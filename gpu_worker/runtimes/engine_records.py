"""A file per engine process a worker started, so the worker's next incarnation stops what this one left.

The launcher (engine_launcher.py) takes its engine down when the worker dies (the kernel's parent-death
signal, and a parent check every second). That covers a SIGKILLed worker, but not everything: a launcher
that was itself killed, or a kernel without prctl, leaves the engine running and holding its GPU's memory
and port. So each engine is also written down here when it starts and crossed out once its release verified
it gone; a worker that claims a GPU (heartbeat.claim_gpus) stops every engine still recorded for that GPU
before it announces the GPU.

One directory per GPU under the data dir (`$PREWARM_DATA_DIR/engines/<node>__<device>/<engine id>.json`).
A record names the launcher (pid, its start time) and an id the engine's whole process tree carries in its
environment (PREWARM_ENGINE_ID): only processes that match either are signalled, so a reused pid or process
group number is never taken for the engine.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger("prewarm.worker")

ENGINE_ID_ENV = "PREWARM_ENGINE_ID"
CREATE_TIME_SLACK = 0.05  # seconds: psutil's start time is read from /proc at tick resolution


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

    def reap(self, gpu: str, *, timeout: float = 15.0) -> list[tuple[EngineRecord, str]]:
        """Stop every engine recorded for `gpu` (SIGKILL to its processes) and drop the records; returns
        each record with a line saying what was found. A record whose processes cannot be stopped is kept."""
        said: list[tuple[EngineRecord, str]] = []
        for rec in self.records(gpu):
            procs = engine_processes(rec)
            for p in procs:
                _kill(p)
            left = _wait_gone(procs, timeout)
            if left:
                said.append((rec, f"engine {rec.engine_id} of {rec.model}@{rec.version} (port {rec.port}): processes "
                                  f"{', '.join(str(p.pid) for p in left)} survived SIGKILL; record kept"))
                continue
            self.remove(gpu, rec.engine_id)
            what = (f"stopped {len(procs)} leftover process(es) ({', '.join(str(p.pid) for p in procs)})" if procs
                    else "already gone")
            said.append((rec, f"engine {rec.engine_id} of {rec.model}@{rec.version} (port {rec.port}, worker pid "
                              f"{rec.worker_pid}): {what}"))
        return said


def engine_processes(rec: EngineRecord) -> list[psutil.Process]:
    """Live processes of the recorded engine: the launcher itself (same pid and start time) and every
    process whose environment carries the engine's id (the server and the processes it spawned)."""
    found: dict[int, psutil.Process] = {}
    try:
        p = psutil.Process(rec.pid)
        if abs(p.create_time() - rec.create_time) <= CREATE_TIME_SLACK and p.status() != psutil.STATUS_ZOMBIE:
            found[p.pid] = p
    except psutil.Error:
        pass
    want = f"{rec.engine_id}"
    for p in psutil.process_iter():
        if p.pid in found:
            continue
        try:
            if p.environ().get(ENGINE_ID_ENV) == want and p.status() != psutil.STATUS_ZOMBIE:
                found[p.pid] = p
        except psutil.Error:  # another user's process, or gone meanwhile
            continue
    return list(found.values())


def _kill(p: psutil.Process) -> None:
    try:
        if os.getpgid(p.pid) == p.pid:  # a group leader (the launcher): its whole group goes
            os.killpg(p.pid, signal.SIGKILL)
        p.send_signal(signal.SIGKILL)
    except (ProcessLookupError, PermissionError, psutil.Error):
        pass


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p)
            except psutil.Error:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
