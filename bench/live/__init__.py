"""`prewarm bench live`: the simulator's figures against the live system on the same replay.

For each policy, on a fresh fleet on this machine — embedded Redis, web (gunicorn), a worker with CPU virtual
GPUs, and a `prewarm scheduler` started with PREWARM_POLICY=<policy> — the mapped trace is replayed through
the real `/hooks/requests` and `/hooks/route`, as a request router would (`router.py`): a request whose first
route answer is not `ready` is a cold start and polls until a replica is ready; its added wait is from its
due time to that answer. Then the simulator runs the same requests (in real seconds), with the catalog's
sizes, the load times the worker measured, the same fleet and the worker's load slots.

The mapping (`workload.py`): the trace's first `--minutes` minutes; its `--models` busiest functions (most
requests in that window) become catalog models `bench-00` (busiest) … ; each model's requests are thinned
with probability min(1, c / n^0.75) (n: its requests; c solved so the replay runs near `--rate` requests per
real second: busy models are thinned most, rare ones kept whole, every model keeps its shape in time); trace
time runs `--speed` times faster than real time. Models are demo residual MLPs (real torch modules, seeded
weights, safetensors) sized from SIZES_MIB in rank order, so size does not follow popularity.
"""
