"""`prewarm bench failover`: Sentinel failovers of a loopback Redis under hook traffic and preloads."""

from .cli import cmd_bench_failover

__all__ = ["cmd_bench_failover"]
