"""A real `prewarm worker` and what its catalog lets it read (issue 17, findings 1 and 6).

One bad catalog entry is refused by name (log, heartbeat, /api/models) while every other entry is served;
a weights file is checked against the model roots when it is opened, and no file byte reaches an error.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from prewarm import celery_app, events, state
from tests import procs
from tests.model_files import model_files, tiny_catalog, write_hostile_header
from tests.procs import WorkerProc, wait_for
from tests.web_support import make_context

worker_factory = procs.worker_factory  # the fixture, used by name

GPU = "node-a/cpu:0"
SECRET = b"root:x:0:0:root:/root:/bin/bash\nsecret-account:x:1:1::/nonexistent:/usr/sbin/nologin\n"
SECRET_AS_LENGTH = str(struct.unpack("<Q", SECRET[:8])[0])  # 3475222254926655346: what used to be echoed


@pytest.fixture
def celery(redis_url: str) -> Iterator[Celery]:
    app = celery_app.make_celery(redis_url)
    yield app
    app.close()


def _variant(catalog: Path, model: str, new_id: str, old: str, new: str) -> str:
    """`model`'s [[models]] entry as another id, with `old` replaced by `new` (to break it)."""
    block = next(b for b in catalog.read_text().split("[[models]]") if f'id = "{model}"' in b)
    assert old in block
    return "\n[[models]]" + block.replace(f'id = "{model}"', f'id = "{new_id}"').replace(old, new)


def _node(r: redis.Redis, name: str = "node-a") -> state.Node | None:
    return next((n for n in state.read_nodes(r) if n.node == name), None)


def test_one_bad_entry_is_refused_by_name_and_every_other_is_served(r: redis.Redis, redis_url: str, celery: Celery,
                                                                    tmp_path: Path, worker_factory) -> None:
    models = tmp_path / "models"
    cat = tiny_catalog(models, ["tiny-lm", "tiny-mlp"])
    good = cat.read_text()
    web_catalog = models / "web.toml"  # web's copy lacks the bad entries: their problems come from the worker
    web_catalog.write_text(good)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    weights = model_files(cat, "tiny-lm")[0]
    shutil.copy(weights, elsewhere / weights.name)
    # A header nested past json's recursion limit (issue 24, 2.1): its RecursionError used to fail every
    # preload of the worker, good models' included.
    (models / "nested-v1").mkdir()
    write_hostile_header(models / "nested-v1" / weights.name, "deeply-nested")
    cat.write_text(good
                   + _variant(cat, "tiny-lm", "escaped", 'weights = "tiny-lm-v1/', 'weights = "../elsewhere/')
                   + _variant(cat, "tiny-lm", "typo", "gpu_worker.demo_models:", "gpu_worker.demo_modles:")
                   + _variant(cat, "tiny-lm", "nested", 'weights = "tiny-lm-v1/', 'weights = "nested-v1/'))

    w: WorkerProc = worker_factory(cat, devices="cpu:0=64MiB")
    q = w.queues[GPU]
    # The good entries are served ...
    for model in ("tiny-lm", "tiny-mlp"):
        out = celery.send_task(celery_app.PRELOAD, args=[model, "v1"], queue=q).get(timeout=60)
        assert out["state"] == "ready" and out["model"] == model
    # ... the bad ones are named in the heartbeat (the node record), each with its problem ...
    node = wait_for(lambda: (n := _node(r)) and n.catalog_problems and n, 10, what="catalog problems", log=w.log)
    assert set(node.catalog_problems) == {"escaped", "typo", "nested"}
    assert "lie outside the model roots" in node.catalog_problems["escaped"]
    assert "builder module 'gpu_worker.demo_modles' cannot be found" in node.catalog_problems["typo"]
    assert "JSON nested too deeply" in node.catalog_problems["nested"]
    # ... and in the log ...
    assert all(f"model {m} refused" in w.log() for m in ("escaped", "typo", "nested"))
    # ... and a preload of one fails with that entry's problem as the reason.
    with pytest.raises(Exception, match="lie outside the model roots") as info:
        celery.send_task(celery_app.PRELOAD, args=["escaped", "v1"], queue=q).get(timeout=30)
    assert node.catalog_problems["escaped"] in str(info.value)
    failed = events.read(r, kind="failed", model="escaped")
    assert failed and node.catalog_problems["escaped"] in failed[0].reason
    assert w.alive()

    # /api/models names them too: web reads what the worker refused from Redis.
    from web.app import create_app

    body = create_app(make_context(redis_url, web_catalog)).test_client().get("/api/models").get_json()
    assert {m["id"] for m in body["models"]} == {"tiny-lm", "tiny-mlp"}
    assert set(body["catalog_problems"]) == {"escaped", "typo", "nested"}
    assert body["catalog_problems"]["escaped"] == f"node node-a: {node.catalog_problems['escaped']}"


def test_a_shard_swapped_for_a_symlink_out_of_the_roots_is_refused_at_open(r: redis.Redis, celery: Celery,
                                                                          tmp_path: Path, worker_factory) -> None:
    cat = tiny_catalog(tmp_path / "models", ["tiny-sharded", "tiny-lm"])
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "passwd"
    secret.write_bytes(SECRET)
    w = worker_factory(cat, devices="cpu:0=64MiB")  # has read the catalog, every file whole and inside
    q = w.queues[GPU]
    shard = model_files(cat, "tiny-sharded")[1]
    shard.unlink()
    shard.symlink_to(secret)  # after the catalog was loaded: only a check at open time sees it
    with pytest.raises(Exception, match="outside the model roots") as info:
        celery.send_task(celery_app.PRELOAD, args=["tiny-sharded", "v1"], queue=q).get(timeout=60)
    assert shard.name in str(info.value)

    # A file inside the roots that holds someone else's bytes: named as no safetensors file, bytes not quoted.
    f = model_files(cat, "tiny-lm")[0]
    f.write_bytes(SECRET)
    with pytest.raises(Exception, match="not a safetensors file") as info2:
        celery.send_task(celery_app.PRELOAD, args=["tiny-lm", "v1"], queue=q).get(timeout=60)

    logged = json.dumps([e.public() for e in events.read(r, limit=200)])
    replicas = json.dumps([x.public() for x in state.read_fleet(r).replicas()])
    for text in (str(info.value), str(info2.value), logged, replicas, w.log()):
        assert SECRET_AS_LENGTH not in text and "root:x" not in text and "secret-account" not in text
    assert len(events.read(r, kind="failed")) == 2 and w.alive()
