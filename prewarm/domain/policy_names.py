"""The policies the live scheduler can run (PREWARM_POLICY), spelled once. Dependency-free, so settings can
check the variable without importing the policy package."""

from __future__ import annotations

DEFAULT = "prewarm"
# prewarm's own plan, then the baselines' decision rules (prewarm.domain.baselines.RULES)
LIVE_POLICIES: tuple[str, ...] = (DEFAULT, "on-demand-lru", "keepalive-10m", "faascache", "hybrid-histogram",
                                  "forecast")


def check(name: str) -> str:
    """The policy name, or ValueError saying which names PREWARM_POLICY takes."""
    if name not in LIVE_POLICIES:
        raise ValueError(f"PREWARM_POLICY={name!r} is not a policy the scheduler runs; write one of "
                         f"{', '.join(LIVE_POLICIES)} (default {DEFAULT})")
    return name
