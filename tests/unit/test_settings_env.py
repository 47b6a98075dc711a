"""Settings.from_env reads each numeric variable with the variable's name in any refusal (issue 25, item 7:
`PREWARM_TICK_SECONDS=2s` used to fail with a bare "could not convert string to float")."""

from __future__ import annotations

import pytest

from prewarm.config import Settings
from prewarm.domain.policy import PolicyConfig


def test_durations_take_units() -> None:
    s = Settings.from_env({"PREWARM_TICK_SECONDS": "2s", "PREWARM_INTENT_TTL": "2m", "PREWARM_LEADER_TTL": "15",
                           "PREWARM_HEARTBEAT_SECONDS": "0.5"})
    assert (s.tick_seconds, s.intent_ttl, s.leader_ttl, s.heartbeat_seconds) == (2.0, 120.0, 15.0, 0.5)
    assert Settings.from_env({}).tick_seconds == 2.0  # unset: the default


def test_the_fill_share_is_a_setting_default_all_free_memory() -> None:
    assert Settings.from_env({}).fill_share == 1.0
    assert Settings.from_env({"PREWARM_FILL_SHARE": "0"}).fill_share == 0.0


@pytest.mark.parametrize("name, raw, words", [
    ("PREWARM_TICK_SECONDS", "2x", "PREWARM_TICK_SECONDS='2x': cannot read '2x' as a duration"),
    ("PREWARM_TICK_SECONDS", "0", "PREWARM_TICK_SECONDS='0': write a duration above 0"),
    ("PREWARM_HEARTBEAT_TTL", "nan", "PREWARM_HEARTBEAT_TTL='nan': cannot read"),
    ("PORT", "eighty", "PORT='eighty': write a whole number from 1 to 65535"),
    ("PORT", "70000", "PORT='70000': write a whole number from 1 to 65535"),  # was OverflowError at the bind
    ("PREWARM_SCHEDULER_METRICS_PORT", "65536", "PREWARM_SCHEDULER_METRICS_PORT='65536': write a whole number from 0 "
                                                "to 65535, e.g. 9108"),
    ("PREWARM_MAX_LOADS_PER_GPU", "0", "PREWARM_MAX_LOADS_PER_GPU='0': write a whole number of 1 or more"),
    ("PREWARM_EVENT_LOG_MAX", "5e3", "PREWARM_EVENT_LOG_MAX='5e3': write a whole number"),
    ("PREWARM_SPECULATIVE_SHARE", "nan", "PREWARM_SPECULATIVE_SHARE='nan': write a finite number"),
    ("PREWARM_FILL_SHARE", "all", "PREWARM_FILL_SHARE='all': write a number"),
    ("PREWARM_FILL_SHARE", "1.5", "PREWARM_FILL_SHARE=1.5: write a share from 0 to 1"),
    ("PREWARM_GPU_HOUR_COST", "two", "PREWARM_GPU_HOUR_COST='two': write a number"),
])
def test_a_bad_value_is_refused_naming_its_variable(name: str, raw: str, words: str) -> None:
    with pytest.raises(ValueError) as info:
        Settings.from_env({name: raw})
    assert str(info.value).startswith(words), str(info.value)


def test_the_processes_own_knobs_are_settings_too() -> None:
    # read once here, not by the worker, the web or the scheduler from os.environ (issue 25, item 7)
    s = Settings.from_env({"PREWARM_WEB_WORKERS": "3", "PREWARM_SCHEDULER_METRICS_PORT": "9108",
                           "PREWARM_WORKER_THREADS": "6", "PREWARM_WARMUP_MAX_PASSES": "0",
                           "PREWARM_WARMUP_MAX_SECONDS": "2s", "PREWARM_FAILED_RETENTION_SECONDS": "1m",
                           "PREWARM_LOAD_THREADS": "2", "PREWARM_LOAD_PACE_BYTES_PER_S": "1e6",
                           "PREWARM_CPU_DEVICE_ARENA": "yes", "PREWARM_HOST_CACHE": " 8GiB ",
                           "PREWARM_ADVERTISE_HOST": "10.0.0.7"})
    assert (s.web_workers, s.scheduler_metrics_port, s.worker_threads) == (3, 9108, 6)
    assert (s.warmup_max_passes, s.warmup_max_seconds, s.failed_retention_seconds) == (0, 2.0, 60.0)
    assert (s.load_threads, s.load_pace_bytes_per_s, s.cpu_device_arena) == (2, 1e6, True)
    assert (s.host_cache, s.advertise_host) == ("8GiB", "10.0.0.7")
    d = Settings.from_env({})
    assert (d.web_workers, d.scheduler_metrics_port, d.worker_threads, d.load_threads, d.load_pace_bytes_per_s,
            d.cpu_device_arena, d.host_cache, d.advertise_host) == (2, 0, None, None, None, False, None, None)


@pytest.mark.parametrize("name, raw, words", [
    ("PREWARM_WEB_WORKERS", "two", "PREWARM_WEB_WORKERS='two': write a whole number of 1 or more"),
    ("PREWARM_WORKER_THREADS", "0", "PREWARM_WORKER_THREADS='0': write a whole number of 1 or more, e.g. 8"),
    ("PREWARM_CPU_DEVICE_ARENA", "maybe", "PREWARM_CPU_DEVICE_ARENA='maybe': write 1 (on) or 0 (off)"),
    ("PREWARM_WARMUP_MAX_SECONDS", "soon", "PREWARM_WARMUP_MAX_SECONDS='soon': cannot read"),
])
def test_a_bad_process_knob_is_refused_naming_its_variable(name: str, raw: str, words: str) -> None:
    with pytest.raises(ValueError) as info:
        Settings.from_env({name: raw})
    assert str(info.value).startswith(words), str(info.value)


def test_the_drain_grace_is_a_duration() -> None:
    assert Settings.from_env({}).drain_grace == 300.0
    assert Settings.from_env({"PREWARM_DRAIN_GRACE": "10m"}).drain_grace == 600.0
    with pytest.raises(ValueError, match="PREWARM_DRAIN_GRACE='-1'"):
        Settings.from_env({"PREWARM_DRAIN_GRACE": "-1"})


def test_the_no_regret_layer_is_on_unless_set_off() -> None:
    """PREWARM_NO_REGRET (issue 26): on by default (unset or blank), 0/off turns it off, junk is refused."""
    assert Settings.from_env({}).no_regret and Settings.from_env({"PREWARM_NO_REGRET": " "}).no_regret
    assert Settings.from_env({"PREWARM_NO_REGRET": "on"}).no_regret
    assert not Settings.from_env({"PREWARM_NO_REGRET": "0"}).no_regret
    assert not Settings.from_env({"PREWARM_NO_REGRET": "off"}).no_regret
    assert Settings.from_env({"PREWARM_NO_REGRET": "1"}).no_regret
    with pytest.raises(ValueError, match="PREWARM_NO_REGRET='sometimes': write 1"):
        Settings.from_env({"PREWARM_NO_REGRET": "sometimes"})


def test_the_stale_rate_refutation_is_automatic_live_unless_set_on_or_off() -> None:
    """PREWARM_REFUTE_STALE_RATE (PolicyConfig.refute_stale_rate, passed on by scheduler.live): auto by default (the
    fleet's record of silences chooses, silences.py), 1 / on always, 0 / off never."""
    assert Settings.from_env({}).refute_stale_rate == "auto" == PolicyConfig().refute_stale_rate
    assert Settings.from_env({"PREWARM_REFUTE_STALE_RATE": " Auto "}).refute_stale_rate == "auto"
    for on in ("1", "on", "true"):
        assert Settings.from_env({"PREWARM_REFUTE_STALE_RATE": on}).refute_stale_rate == "on"
    for off in ("0", "off", "no"):
        assert Settings.from_env({"PREWARM_REFUTE_STALE_RATE": off}).refute_stale_rate == "off"
    with pytest.raises(ValueError, match="PREWARM_REFUTE_STALE_RATE='maybe': write auto, 1 \\(on\\) or 0"):
        Settings.from_env({"PREWARM_REFUTE_STALE_RATE": "maybe"})


def test_link_wait_is_on_live_unless_set_off() -> None:
    """PREWARM_LINK_WAIT (PolicyConfig.link_wait, and the route hook's idle links): on by default, 0 turns it off."""
    assert Settings.from_env({}).link_wait and not Settings.from_env({"PREWARM_LINK_WAIT": "0"}).link_wait
    assert PolicyConfig().link_wait
    with pytest.raises(ValueError, match="PREWARM_LINK_WAIT='maybe': write 1"):
        Settings.from_env({"PREWARM_LINK_WAIT": "maybe"})


def test_whole_experts_are_on_live_unless_set_off() -> None:
    """PREWARM_WHOLE_EXPERTS (prewarm.domain.whole): on live by default, 0 turns it off, junk is refused."""
    assert Settings.from_env({}).whole_experts and not Settings.from_env({"PREWARM_WHOLE_EXPERTS": "0"}).whole_experts
    with pytest.raises(ValueError, match="PREWARM_WHOLE_EXPERTS='maybe': write 1"):
        Settings.from_env({"PREWARM_WHOLE_EXPERTS": "maybe"})
