"""Shared fixtures: a throwaway Redis server per test session, emptied before each test that uses it.

Tests never touch a Redis they did not start.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from prewarm.redis_server import EmbeddedRedis
from tests.procs import remove_made_dirs
from tests.scheduler_procs import SchedulerProc
from tests.web_support import WebProc


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    remove_made_dirs()  # the workers' data folders (tests/procs.py)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def artifacts_dir() -> Path:
    path = Path(os.environ.get("PREWARM_ARTIFACTS") or Path(__file__).resolve().parent.parent / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- system tests: a one-worker gunicorn web over the module's `catalog`, and the schedulers a test starts ---
@pytest.fixture
def web(redis_url: str, catalog: Path, tmp_path: Path) -> Iterator[WebProc]:
    w = WebProc(redis_url, catalog, tmp_path, workers=1)
    yield w
    w.stop()


@pytest.fixture
def schedulers() -> Iterator[list[SchedulerProc]]:
    started: list[SchedulerProc] = []
    yield started
    for s in started:
        s.stop()
