"""Settings.from_env reads each numeric variable with the variable's name in any refusal (issue 25, item 7:
`PREWARM_TICK_SECONDS=2s` used to fail with a bare "could not convert string to float")."""

from __future__ import annotations

import pytest

from prewarm.config import Settings


def test_durations_take_units() -> None:
    s = Settings.from_env({"PREWARM_TICK_SECONDS": "2s", "PREWARM_INTENT_TTL": "2m", "PREWARM_LEADER_TTL": "15",
                           "PREWARM_HEARTBEAT_SECONDS": "0.5"})
    assert (s.tick_seconds, s.intent_ttl, s.leader_ttl, s.heartbeat_seconds) == (2.0, 120.0, 15.0, 0.5)
    assert Settings.from_env({}).tick_seconds == 2.0  # unset: the default


@pytest.mark.parametrize("name, raw, words", [
    ("PREWARM_TICK_SECONDS", "2x", "PREWARM_TICK_SECONDS='2x': cannot read '2x' as a duration"),
    ("PREWARM_TICK_SECONDS", "0", "PREWARM_TICK_SECONDS='0': write a duration above 0"),
    ("PREWARM_HEARTBEAT_TTL", "nan", "PREWARM_HEARTBEAT_TTL='nan': cannot read"),
    ("PORT", "eighty", "PORT='eighty': write a whole number of 1 or more"),
    ("PREWARM_MAX_LOADS_PER_GPU", "0", "PREWARM_MAX_LOADS_PER_GPU='0': write a whole number of 1 or more"),
    ("PREWARM_EVENT_LOG_MAX", "5e3", "PREWARM_EVENT_LOG_MAX='5e3': write a whole number"),
    ("PREWARM_SPECULATIVE_SHARE", "nan", "PREWARM_SPECULATIVE_SHARE='nan': write a finite number"),
    ("PREWARM_GPU_HOUR_COST", "two", "PREWARM_GPU_HOUR_COST='two': write a number"),
])
def test_a_bad_value_is_refused_naming_its_variable(name: str, raw: str, words: str) -> None:
    with pytest.raises(ValueError) as info:
        Settings.from_env({name: raw})
    assert str(info.value).startswith(words), str(info.value)
