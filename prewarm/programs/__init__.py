"""prewarm's programs and their command-line glue: the `prewarm` command (`cli`), the operator commands
(`ops`), `prewarm up` (`up`), the traffic player (`replay`) and `prewarm engines` (`engines`).

They may use every other package; nothing outside this package imports it (the core, the worker, the
scheduler and the web app are libraries the programs drive). Each part's own commands are registered by
that part's `cli` module (gpu_worker.cli, scheduler.cli, web.cli, simulator.cli, bench.*.cli) through
prewarm.commands.subgroup.
"""
