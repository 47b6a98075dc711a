"""Output paths and --set values are refused as the command line is read (prewarm/arg_types.py,
simulator.diagnose.config_override): a run is not lost at its last step to a file it cannot write, and a knob
no replay can use is not a traceback or a replay that never ends (tick_s=-1 ticked backwards for ever)."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import pytest

from prewarm import arg_types
from simulator import diagnose, sweep
from simulator.cli import main as simulate_main


def test_output_file_refuses_what_it_cannot_write_and_leaves_nothing(tmp_path: Path) -> None:
    assert arg_types.output_file(str(tmp_path / "new.json")) == str(tmp_path / "new.json")
    assert not (tmp_path / "new.json").exists()  # the check made nothing
    old = tmp_path / "old.json"
    old.write_text("kept")
    assert arg_types.output_file(str(old)) == str(old)
    assert old.read_text() == "kept"  # checked for writing, not truncated
    for bad, words in [(tmp_path / "missing" / "x.json", "there is no folder"), (tmp_path, "is a folder")]:
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            arg_types.output_file(str(bad))
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(argparse.ArgumentTypeError, match="cannot write"):
            arg_types.output_file(str(ro / "x.json"))


def test_output_folder_may_be_made_later_but_not_through_a_file(tmp_path: Path) -> None:
    assert arg_types.output_folder(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []  # neither made nor probed-and-left
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="is a file"):
        arg_types.output_folder(str(f))
    with pytest.raises(argparse.ArgumentTypeError, match="lies under the file"):
        arg_types.output_folder(str(f / "sub"))


def test_simulate_refuses_an_unwritable_json_before_replaying(tmp_path: Path, capsys: pytest.CaptureFixture[str]) \
        -> None:
    trace = tmp_path / "t.csv"  # never read: the command line is refused first
    with pytest.raises(SystemExit) as e:
        simulate_main(["simulate", str(trace), "--json", str(tmp_path / "no" / "r.json")])
    assert e.value.code == 2
    assert "argument --json: cannot write" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        simulate_main(["simulate", str(trace), "--policies", ","])
    assert e.value.code == 2
    assert "argument --policies: names none (known: on-demand-lru," in capsys.readouterr().err


def test_a_size_means_the_same_bytes_to_every_command_and_setting(tmp_path: Path) -> None:
    """prewarm.units is the one reader: the simulator read 80GB as 80 GiB while PREWARM_DEVICES and bench tick read
    80,000,000,000 bytes (its own parser, binary for every unit); decimal units are powers of 1000 everywhere now."""
    from prewarm.config import parse_devices
    from prewarm.units import parse_bytes, parse_rate

    assert parse_bytes("80GB") == 80 * 1000**3 and parse_bytes("80GiB") == 80 * 1024**3
    assert parse_bytes("512MiB") == 512 << 20 and parse_bytes(" 1.5 kib ") == 1536 and parse_bytes("1024") == 1024
    assert parse_rate("2GiB/s") == parse_rate("2GiB") == 2.0 * 1024**3
    for bad in ("1.2.3", "80XB", "", "-5GiB", "GiB"):
        with pytest.raises(ValueError, match="as a size: write e.g. 4GiB"):
            parse_bytes(bad)
    assert parse_devices("cpu:0=80GB")[0].budget_bytes == arg_types.size_at_least(1)("80GB") == 80 * 1000**3
    trace = tmp_path / "t.csv"
    trace.write_text("HashFunction,1,2\nm,3,1\n")
    out = tmp_path / "r.json"
    assert simulate_main(["simulate", str(trace), "--gpus", "1", "--gpu-memory", "80GB", "--policies",
                          "on-demand-lru", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["fleet"]["gpu_bytes"] == 80 * 1000**3


@pytest.mark.parametrize(("option", "value", "words"), [
    ("--gpu-memory", "1.2.3", "cannot read '1.2.3' as a size"),  # was float()'s "could not convert string to float"
    ("--gpu-memory", "0", "'0' is not a size above 0"),
    ("--host-memory", "lots", "cannot read 'lots' as a size"),
    ("--stage-bandwidth", "0", "'0' is not a bandwidth above 0"),  # would divide by zero at the first stage
    ("--promote-bandwidth", "fast", "cannot read 'fast' as a size"),
])
def test_simulate_refuses_a_size_it_cannot_read_as_read(option: str, value: str, words: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        simulate_main(["simulate", str(tmp_path / "never-read.csv"), f"{option}={value}"])
    assert e.value.code == 2
    assert f"argument {option}: {words}" in capsys.readouterr().err


@pytest.mark.parametrize("main", [diagnose.main, sweep.main])
def test_diagnose_and_the_sweep_refuse_a_bad_gpu_memory_as_read(main, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(tmp_path / "never-read.csv")] if main is diagnose.main else ["--traces", str(tmp_path)]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--gpu-memory", "80XB"])
    assert e.value.code == 2
    assert "argument --gpu-memory: cannot read '80XB' as a size" in capsys.readouterr().err


def test_sweep_refuses_an_out_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "f"
    f.write_text("")
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command")
    sweep.register(sub)
    with pytest.raises(SystemExit):
        p.parse_args(["simulate-sweep", "--out", str(f)])
    assert "cannot write into" in capsys.readouterr().err


@pytest.mark.parametrize(("item", "words"), [
    ("tick_s", "write FIELD=VALUE"),
    ("bogus=1", "no field 'bogus'"),
    ("tick_s=abc", "tick_s is a number"),
    ("tick_s=-1", "above 0"),
    ("tick_s=0", "above 0"),
    ("tick_s=nan", "above 0"),
    ("tick_s=none", "cannot be none"),
    ("hist_bins=2.5", "whole number"),
    ("eviction_cooldown_s=-5", "at least 0"),
    ("no_regret=maybe", "true or false"),
    ("refute_stale_rate=x", "auto, on, off"),
])
def test_config_override_refuses_what_no_replay_can_use(item: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        diagnose.config_override(item)


def test_config_override_reads_each_field_by_its_kind() -> None:
    assert diagnose.config_override("tick_s=5") == ("tick_s", 5.0)
    assert isinstance(diagnose.config_override("tick_s=5")[1], float)
    assert diagnose.config_override("max_loads_per_gpu=3") == ("max_loads_per_gpu", 3)
    assert diagnose.config_override("no_regret=False") == ("no_regret", False)
    assert diagnose.config_override("overdue_wait_s=none") == ("overdue_wait_s", None)
    assert diagnose.config_override("overdue_wait_s=60") == ("overdue_wait_s", 60.0)
    assert diagnose.config_override("refute_stale_rate=on") == ("refute_stale_rate", "on")


@pytest.mark.parametrize("argv", [
    ["bench", "live", "--gpus", "0"],  # was a ZeroDivisionError once the fleet was being built
    ["bench", "live", "--models", "0"],
    ["bench", "live", "--minutes", "nan"],
    ["bench", "live", "--seed", "-1"],
    ["bench", "load", "--runs", "0"],  # was "no median for empty data" after the model was written
    ["bench", "load", "--size", "0"],  # timed the calls around 11 empty tensors, not a load
    ["bench", "load", "--idle", "-1"],
    ["bench", "load", "--dir", "/nonexistent-folder"],  # was a traceback from mkdtemp
    ["bench", "load", "--device", "bogus"],  # was torch's RuntimeError
])
def test_bench_options_no_run_can_use_are_refused_as_read(argv: list[str], capsys: pytest.CaptureFixture[str]) \
        -> None:
    from prewarm.programs.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    assert f"argument {argv[2]}" in capsys.readouterr().err


@pytest.mark.parametrize(("module", "kwargs", "words"), [
    ("bench.tick.run", {"models": 10, "gpus": 1, "ticks": 2, "rate": -1.0}, "--rate"),  # numpy: "lam < 0 ..."
    ("bench.tick.run", {"models": 10, "gpus": 1, "ticks": 2, "seed": -1}, "--seed"),
    ("bench.tick.run", {"models": 10, "gpus": 1, "ticks": 2, "gpu_memory": 0}, "--gpu-memory"),  # ran, 0-byte GPUs
    ("bench.tick.run", {"models": 10, "gpus": 1, "ticks": 2, "zipf": math.nan}, "--zipf"),
    ("bench.router.run", {"cold_seconds": math.nan}, "--cold-seconds"),  # ran "cold for nan s"
    ("bench.failover.run", {"settle": -1.0}, "--settle"),  # failed after starting Sentinel, web, worker
])
def test_bench_runs_refuse_what_they_cannot_use_before_starting_anything(module: str, kwargs: dict, words: str) \
        -> None:
    import importlib

    run_bench = importlib.import_module(module).run_bench
    with pytest.raises(Exception, match=words) as e:
        run_bench(**kwargs)
    assert type(e.value).__name__ in ("ValueError", "BenchError")


def test_models_demo_refuses_an_out_it_cannot_make(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from prewarm.programs.cli import build_parser

    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["models", "demo", "--out", str(f)])  # was os.mkdir's FileExistsError
    assert "argument --out: cannot write into" in capsys.readouterr().err


def test_a_bench_ended_by_sigterm_unwinds_and_its_handler_is_restored() -> None:
    # the bench commands run inside sigterm_unwinds (bench/term.py): a `timeout` of `prewarm bench router` left
    # its redis-server and two web processes running under the default SIGTERM
    import signal

    from bench.term import sigterm_unwinds

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e, sigterm_unwinds():
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in this thread before the next line
        pytest.fail("SIGTERM did not unwind")
    assert e.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before
