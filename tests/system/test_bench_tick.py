"""`prewarm bench tick`: registered beside `bench load`, and a small run prints the figures it promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from prewarm.programs.cli import build_parser
from prewarm.safetensors_header import read_header

ROOT = Path(__file__).resolve().parents[2]


def test_prewarm_bench_tick_is_the_bench_package() -> None:
    from bench.tick import cmd_bench_tick

    args = build_parser().parse_args(["bench", "tick", "--models", "50", "--gpus", "4", "--ticks", "3", "--json"])
    assert args.func is cmd_bench_tick and (args.models, args.gpus, args.ticks, args.json) == (50, 4, 3, True)


def test_a_sparse_sized_model_is_a_valid_file_of_its_size(tmp_path: Path) -> None:
    from gpu_worker.sized_catalog import write_sized_catalog

    write_sized_catalog(tmp_path, {"big": 40 * 1024**3}, sparse=True)
    f = tmp_path / "big-v1.safetensors"
    assert read_header(f, [tmp_path]).data_bytes == 40 * 1024**3
    assert f.stat().st_blocks * 512 < 1024**2  # a hole, not 40 GiB of disk


def test_a_small_run_prints_every_figure(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PREWARM_REDIS_URL"}  # its own embedded Redis
    env["PREWARM_DATA_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "prewarm.programs.cli", "bench", "tick", "--models", "30", "--gpus", "4",
                           "--ticks", "3", "--interval", "0.2", "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    for part in ("tick_seconds", "snapshot_seconds", "plan_seconds", "dispatch_seconds"):
        assert set(out[part]) == {"p50", "p95"} and 0 <= out[part]["p50"] <= out[part]["p95"], (part, out[part])
    assert out["first_tick_seconds"] > 0 and out["redis_bytes"] > 0
    assert out["settings"]["replicas"] > 0 and out["round_trips"]["p50"] >= 3
    for part in ("snapshot", "plan", "dispatch", "redis"):  # CPU seconds, apart from waiting for a core
        assert 0 <= out["cpu_seconds"][part]["p50"] <= out["cpu_seconds"][part]["p95"], part
    # The bench's workers took what the first tick sent before the second (see bench.tick.fleet.BenchWorker).
    assert len(out["ticks"]) == 3 and out["settings"]["worker"] == "acknowledging"
    assert out["ticks"][0]["dispatched"] > 0 and out["settings"]["tasks_done"] >= out["ticks"][0]["dispatched"]


def test_the_bench_workers_do_what_the_scheduler_sends(redis_url: str, tmp_path: Path) -> None:
    """Evicts remove their replica, preloads load and turn ready after their load time (recorded as the
    worker records them), and every intent is released once its task is done."""
    import redis

    from bench.tick.fleet import BenchFleet, BenchWorker, Workload
    from prewarm import keys
    from prewarm.celery_app import make_celery
    from prewarm.dispatch import Dispatcher
    from prewarm.store import load_times

    r = redis.Redis.from_url(redis_url)
    w = Workload.make(20, 50.0, 1.1, 0)
    now = time.time()
    fleet = BenchFleet.place(w, 2, 80 * 1024**3, now)
    g = fleet.gpus[0]
    victim = fleet.replicas[g.id][0]
    newcomer = next(m for m in w.ids if all(x.model != m for x in fleet.replicas[g.id]))
    g.free_bytes += int(w.sizes[w.ids.index(newcomer)])  # room for it whatever the fill left
    bw = BenchWorker(fleet, {m: int(x) for m, x in zip(w.ids, w.sizes, strict=True)})
    app = make_celery(redis_url)
    d = Dispatcher(r, app)
    assert d.evict(victim.model, "v1", g, actor="scheduler", reason="room").sent
    assert d.preload(newcomer, "v1", g, actor="scheduler", reason="demand").sent
    assert bw.step(r, now) == 2
    assert all(x.model != victim.model for x in fleet.replicas[g.id])
    assert not r.exists(keys.intent(victim.model, g.id))
    [loading] = [x for x in fleet.replicas[g.id] if x.model == newcomer]
    assert loading.state == "loading" and r.exists(keys.intent(newcomer, g.id))  # held until ready
    assert bw.step(r, now + 3600) == 0
    assert loading.state == "ready" and not r.exists(keys.intent(newcomer, g.id))
    assert load_times.recent(r, [newcomer])[newcomer].load  # recorded as its worker records a load
    app.close()
    r.close()


def test_a_bad_option_says_what_to_fix() -> None:
    proc = subprocess.run([sys.executable, "-m", "prewarm.programs.cli", "bench", "tick", "--ticks", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--ticks at least 2" in proc.stderr


def test_sigterm_ends_a_run_and_its_embedded_redis(tmp_path: Path) -> None:
    """`timeout` or a supervisor ends a run with SIGTERM: the run stops (exit 143) and takes its embedded Redis with
    it (SIGTERM's default had left the server running)."""
    env = {k: v for k, v in os.environ.items() if k != "PREWARM_REDIS_URL"}
    env["PREWARM_DATA_DIR"] = str(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "prewarm.programs.cli", "bench", "tick", "--models", "30", "--gpus",
                             "4", "--ticks", "100000", "--interval", "0.2"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the run is ticking: its Redis is up
            if line.startswith("tick 1/"):
                break
        children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        assert children, "the run's embedded Redis"
        proc.terminate()
        assert proc.wait(timeout=60) == 143
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{c}").exists() for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(Path(f"/proc/{c}").exists() for c in children), "a process was left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
