"""prewarm behind LiteLLM: its Router (Python) or its proxy routes to prewarm's ready replicas.

    from litellm import Router
    from prewarm.integrations.litellm import PrewarmRouting, model_groups

    router = Router(model_list=model_groups(["tiny-llama-vllm"]))   # names only: prewarm says where
    router.register_plugin(PrewarmRouting("http://prewarm-web:8000", token=os.environ.get("PREWARM_HOOK_TOKEN")))
    await router.acompletion(model="tiny-llama-vllm", messages=[...], metadata={"priority": "high"})

`PrewarmRouting` is a LiteLLM custom routing strategy (`CustomRoutingStrategyBase`); for each request it
- reports it to prewarm (`prewarm.client.TrafficReporter`: in memory, posted in batches off the request
  path), once per request: LiteLLM's retries of it pick again but are not counted again;
- routes it to one of the model's ready replicas from `GET /hooks/route` (cached at most `route_ttl`, 1 s),
  the least busy first as prewarm orders them (ties taken in turn), as a deployment made for the pick:
  `api_base` = the replica's `endpoint`, so replicas that appear, move or go are followed without a restart
  and without a `model_list` entry;
- while the model is cold: serves it with the route answer's `fallback` (a warm catalog model, or a URL)
  and says so; without one waits, re-asking with `retry=1`, up to `cold_wait` seconds, then fails with
  LiteLLM's usual "no deployments available" error (`RouterRateLimitError`) whose `cooldown_time` is
  prewarm's ETA (the proxy answers it with `Retry-After`).
What it decided is written to the request's metadata as `metadata["prewarm"]` (`served_by`, `gpu`,
`endpoint`, `fallback`, `waited_s`, `eta_seconds`), and the deployment's id (`_hidden_params["model_id"]`,
the proxy's `x-litellm-model-id`) names the replica: `prewarm:<model>@<version>:<gpu>`.

On the proxy, `PrewarmCallback` (a `CustomLogger`, see `proxy.py`) installs the strategy on the proxy's
router and adds `x-prewarm-served-by` / `x-prewarm-fallback` to every answer. Streaming is LiteLLM's own:
the strategy only picks where a request goes. Needs `litellm` (the `litellm` extra); prewarm's core
never imports this package. The version it is tested against is the `litellm` extra's pin (pyproject.toml).
"""

from prewarm.integrations.litellm.routing import (
    DEFAULT_COLD_WAIT_S,
    PRIORITY_KEY,
    PrewarmRouting,
    model_groups,
)

__all__ = ["DEFAULT_COLD_WAIT_S", "PRIORITY_KEY", "PrewarmRouting", "model_groups"]
