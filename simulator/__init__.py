"""Trace-replay simulator: replays request traces through prewarm.domain.policy.plan and the baselines."""
