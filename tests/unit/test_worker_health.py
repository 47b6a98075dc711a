"""The worker's health file and what `prewarm probe live|ready` decides from it (gpu_worker/health.py)."""

from __future__ import annotations

from pathlib import Path

from gpu_worker import health

NOW = 1_000_000.0


def _h(**kw: object) -> health.Health:
    base: dict[str, object] = dict(pid=1, announced=True, stopping=False, beat_at=NOW - 1, beat_ok_at=NOW - 1,
                                   heartbeat_seconds=2.0, heartbeat_ttl=10.0)
    base.update(kw)
    return health.Health(**base)  # type: ignore[arg-type]


def test_a_beating_announced_worker_is_live_and_ready() -> None:
    assert health.live_problem(_h(), NOW) is None
    assert health.ready_problem(_h(), NOW) is None


def test_redis_unreachable_is_live_but_not_ready() -> None:
    h = _h(beat_ok_at=NOW - 30)  # beats tried, none reached Redis for 30 s (a failover, an outage)
    assert health.live_problem(h, NOW) is None
    assert "PREWARM_HEARTBEAT_TTL" in (health.ready_problem(h, NOW) or "")


def test_not_announced_or_stopping_is_not_ready() -> None:
    assert "not connected" in (health.ready_problem(_h(announced=False, beat_ok_at=None), NOW) or "")
    assert "stopping" in (health.ready_problem(_h(stopping=True), NOW) or "")
    assert health.live_problem(_h(stopping=True), NOW) is None


def test_a_stale_file_is_neither_live_nor_ready() -> None:
    h = _h(beat_at=NOW - 60, beat_ok_at=NOW - 60)  # left by an earlier container, or a stuck heartbeat
    assert "stuck" in (health.live_problem(h, NOW) or "")
    assert "has stopped" in (health.live_problem(_h(beat_at=NOW - 60, stopping=True), NOW) or "")
    assert health.ready_problem(h, NOW) is not None


def test_check_reads_the_file_and_names_a_missing_or_bad_one(tmp_path: Path) -> None:
    path = health.path_for(tmp_path, "gpu node/1")
    assert path.name == "worker-gpu_node_1.json"
    assert "does not exist" in (health.check(path, "ready", NOW) or "")
    health.write(path, _h())
    assert health.check(path, "live", NOW) is None
    assert health.check(path, "ready", NOW) is None
    path.write_text("{not json")
    assert "cannot be read" in (health.check(path, "live", NOW) or "")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left beside it
