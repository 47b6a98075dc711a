"""Trace-replay simulator: replays request traces through scheduler.policy.plan and the baselines."""
