"""Benchmarks: they print figures and assert nothing (`prewarm bench load`: bench.load; the hooks
under load: `python bench/hooks_load.py`). Installed with prewarm so the CLI finds them."""
