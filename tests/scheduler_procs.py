"""Real scheduler processes for system tests (workers: tests.procs; web: tests.web_support.WebProc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from prewarm import keys
from prewarm.runtime import connect

REPO = Path(__file__).resolve().parent.parent


class SchedulerProc:
    """`prewarm scheduler` with a fast tick and a short leader TTL."""

    def __init__(self, redis_url: str, catalog: Path, work: Path, *, tick: float = 0.5, leader_ttl: float = 2.0,
                 env: dict[str, str] | None = None) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.redis_url = redis_url
        e = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
        e.update({"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog),
                  "PREWARM_TICK_SECONDS": str(tick), "PREWARM_LEADER_TTL": str(leader_ttl),
                  "PREWARM_DATA_DIR": str(work / "scheduler-data"), "PYTHONPATH": str(REPO),
                  "PYTHONUNBUFFERED": "1", **(env or {})})
        self.log_path = work / f"scheduler-{os.getpid()}-{id(self)}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "prewarm.programs.cli", "scheduler"], env=e, cwd=REPO,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.ident = f"{os.uname().nodename}:{self.proc.pid}"

    def is_leader(self) -> bool:
        r = connect(self.redis_url)  # redis://, rediss:// and sentinel:// alike
        try:
            return r.get(keys.LEADER_LOCK) == self.ident.encode()
        finally:
            r.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
