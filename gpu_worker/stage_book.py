"""What the node's host cache is doing besides holding bytes: the stages in progress, the reason each
staged copy was staged for, and the weight files' fingerprints as they were read (a promotion compares
them). One lock guards all three; the lifecycle, the publisher and the host cache operations use it
through these methods, never its fields."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import replace

from gpu_worker.held import StageJob
from prewarm import state

Fingerprint = dict[str, tuple[int, int]]  # weight file -> (size, mtime_ns)


class StageBook:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, StageJob] = {}  # "model@version" being staged now
        self._reasons: dict[str, str | None] = {}
        self._files: dict[str, Fingerprint] = {}

    # --- stages in progress ------------------------------------------------------------------------
    def keys(self) -> set[str]:
        """The keys being staged now."""
        with self._lock:
            return set(self._jobs)

    def claim(self, key: str, make: Callable[[], StageJob]) -> tuple[StageJob, bool]:
        """The stage of `key` in progress, or a new one from `make`; and whether the caller owns it."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None:
                return job, False
            job = self._jobs[key] = make()
            return job, True

    def finish(self, key: str, *, reason: str | None) -> None:
        """The stage of `key` ended; `reason` is kept as the staged copy's when it succeeded (None: failed)."""
        with self._lock:
            self._jobs.pop(key, None)
            if reason is not None:
                self._reasons[key] = reason or None

    def update(self, job: StageJob, done: int, total: int) -> None:
        with self._lock:
            job.record.bytes, job.record.total_bytes = done, total
            job.record.progress = round(done / total, 4) if total else 1.0

    def cancel(self, match: Callable[[str], bool], reason: str) -> list[StageJob]:
        """Ask every stage whose key matches to stop; the jobs, to wait on."""
        with self._lock:
            jobs = [j for k, j in self._jobs.items() if match(k)]
            for j in jobs:
                j.cancel, j.cancel_reason = True, reason
        return jobs

    # --- staged copies -----------------------------------------------------------------------------
    def files(self, key: str) -> Fingerprint | None:
        with self._lock:
            return self._files.get(key)

    def set_files(self, key: str, files: Fingerprint) -> None:
        with self._lock:
            self._files[key] = files

    def forget(self, keys: Iterable[str]) -> None:
        """These copies left the cache: their reasons and fingerprints go with them."""
        with self._lock:
            for k in keys:
                self._reasons.pop(k, None)
                self._files.pop(k, None)

    def published(self, done: set[str], staged: Callable[[dict[str, str | None]], list[state.Staged]]
                  ) -> list[state.Staged]:
        """The staged records `staged(reasons)` builds for the cache's entries, then the stages in progress
        whose key is not in `done`: one consistent view under the lock."""
        with self._lock:
            out = staged(dict(self._reasons))
            out += [replace(j.record) for k, j in self._jobs.items() if k not in done]
            return out
