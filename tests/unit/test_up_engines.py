"""`prewarm up` with an engine model in the catalog: the device it adds and the traffic it gives it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_worker import demo_models as dm
from prewarm.programs.replay import Request, light_requests, split_models
from prewarm.programs.up import DEFAULT_DEVICES, ENGINE_DEVICE, adapter_traffic, choose_devices, engine_models


def test_a_vllm_model_in_the_catalog_adds_the_engine_device(tmp_path: Path) -> None:
    with_engine = dm.write_demo(tmp_path / "a", small=True, vllm=True)
    without = dm.write_demo(tmp_path / "b", small=True, vllm=False)
    assert engine_models(with_engine) == ["tiny-llama-vllm"] and engine_models(without) == []
    assert choose_devices(None, ["tiny-llama-vllm"]) == f"{DEFAULT_DEVICES},{ENGINE_DEVICE}"
    assert choose_devices(None, []) == DEFAULT_DEVICES
    assert choose_devices("cpu:0=8GiB", ["tiny-llama-vllm"]) == "cpu:0=8GiB"  # what the operator gave wins


def test_light_traffic_is_one_request_per_interval() -> None:
    reqs = light_requests(["engine"], span=600.0, every=120.0)
    assert reqs == [Request(t, "engine") for t in (0.0, 120.0, 240.0, 360.0, 480.0)]
    assert light_requests(["engine"], span=10.0, every=120.0) == [Request(0.0, "engine")]


def test_the_demo_adapters_get_light_traffic_up_to_their_bases_slots(tmp_path: Path) -> None:
    with_engine = dm.write_demo(tmp_path / "a", small=True, vllm=True)
    light, idle = adapter_traffic(with_engine)
    slots = dm.VLLM_LORA_FIELDS["max_adapters"]
    demo = [a.id for a in dm.ADAPTERS]
    assert light == demo[:slots] and idle == demo[slots:]  # the demo's base has 2 slots for its 3 adapters
    assert adapter_traffic(dm.write_demo(tmp_path / "b", small=True, vllm=False)) == ([], [])


def test_replay_maps_the_rest_onto_the_trace_and_skips_what_it_is_told() -> None:
    models = ["lm", "engine", "lora-a", "lora-c"]
    assert split_models(models, ["engine", "lora-a", "gone"], ["lora-c"]) == (["lm"], ["engine", "lora-a"])
    assert split_models(models, [], []) == (models, [])


def test_up_refuses_a_taken_port_before_starting_anything(monkeypatch, capsys) -> None:  # noqa: ANN001
    # before: Redis, the worker and the scheduler started, and the web alone stopped them 5 s later, its
    # "Connection in use" deep in the log
    import socket

    from prewarm.programs import up
    from prewarm.programs.cli import build_parser
    from web.cli import port_taken

    started: list[str] = []
    monkeypatch.setattr("prewarm.runtime.redis_url", lambda _s: started.append("redis") or "redis://x")
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        assert port_taken("127.0.0.1", port) == "Address already in use"
        args = build_parser().parse_args(["up", "--port", str(port), "--no-traffic"])
        assert up.cmd_up(args) == 2
    assert started == []
    assert f"127.0.0.1:{port} is taken" in capsys.readouterr().err
    assert port_taken("127.0.0.1", port) is None  # free again once closed


def test_web_refuses_a_taken_port_before_starting_redis(monkeypatch, capsys) -> None:  # noqa: ANN001
    # before: the embedded Redis started and gunicorn retried the bind for 5 s, then exited
    import socket

    from prewarm.programs.cli import build_parser
    from web.cli import cmd_web

    started: list[str] = []
    monkeypatch.setattr("prewarm.runtime.redis_url", lambda *_a, **_k: started.append("redis") or "redis://x")
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        assert cmd_web(build_parser().parse_args(["web", "--port", str(port)])) == 2
    assert started == []
    assert f"127.0.0.1:{port} is taken" in capsys.readouterr().err
    for bad in (["--port", "0"], ["--workers", "0"], ["--threads", "0"]):  # port, workers: silently the default
        with pytest.raises(SystemExit):
            build_parser().parse_args(["web", *bad])


def test_scheduler_refuses_a_metrics_port_it_cannot_serve(capsys) -> None:  # noqa: ANN001
    # 70000 was an OverflowError traceback from the bind; a taken port an OSError traceback
    import socket

    from prewarm.programs.cli import build_parser
    from scheduler.cli import cmd_scheduler

    for bad in ("70000", "-1", "x"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["scheduler", "--metrics-port", bad])
    assert build_parser().parse_args(["scheduler", "--metrics-port", "0"]).metrics_port == 0  # off
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        assert cmd_scheduler(build_parser().parse_args(["scheduler", "--metrics-port", str(port)])) == 2
    assert f"cannot serve metrics on 127.0.0.1:{port} (Address already in use)" in capsys.readouterr().err
