"""prewarm's domain: the pure rules, with no I/O (no Redis, no Celery, no torch, no Flask, no clock).

- states: the replica and staged-copy state names (one place they are spelled)
- policy_names: which policies exist and the default
- policy/: the warming policy, plan(snapshot, now, state) -> actions, and its optional native build
- baselines/: the comparison policies (LRU, FaasCache, hybrid histogram, forecast), live and in the simulator
- choice: picks the policy a name stands for
- slo: the cold-start SLO controller that steers the speculative budget

Everything above (the store, the services, the scheduler, the worker, the web, the simulator) imports from
here; nothing here imports from them (tests/unit/test_layering.py).
"""
