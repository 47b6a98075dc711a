"""prewarm on LiteLLM's proxy: a `CustomLogger` that puts `PrewarmRouting` on the proxy's router and says in
every answer's headers where prewarm sent the request.

In the proxy's config.yaml (examples/litellm/config.yaml):

    litellm_settings:
      callbacks: prewarm.integrations.litellm.proxy.handler

`handler` is made when the proxy imports this module, from the environment of the proxy's process:
`PREWARM_URL` (prewarm's web, default http://127.0.0.1:8000), `PREWARM_HOOK_TOKEN` (when prewarm's hooks
need one) and `PREWARM_LITELLM_COLD_WAIT` (seconds a request for a cold model with no fallback waits; 30).
These are the router's settings, read here because this module runs in LiteLLM's process, not prewarm's.

Answers carry `x-prewarm-served-by` (the catalog model that served it), `x-prewarm-gpu` and, when the
route answer's fallback served it, `x-prewarm-fallback: <requested model>`; LiteLLM's own
`x-litellm-model-id` names the replica (`prewarm:<model>@<version>:<gpu>`).
"""

from __future__ import annotations

import os
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from prewarm.integrations.litellm.routing import DEFAULT_COLD_WAIT_S, STAMP, PrewarmRouting


class PrewarmCallback(CustomLogger):
    def __init__(self, routing: PrewarmRouting) -> None:
        super().__init__()
        self.routing = routing
        self._installed_on: Any = None

    def install(self, router: Any) -> None:
        """Make `routing` the router's strategy (the proxy builds its router after loading callbacks, and
        again on a config reload: each new one gets it on its first request)."""
        if router is not None and router is not self._installed_on:
            router.register_plugin(self.routing)
            self._installed_on = router

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict,
                                  call_type: Any) -> dict:
        from litellm.proxy import proxy_server  # only on the proxy, which has it

        self.install(getattr(proxy_server, "llm_router", None))
        return data

    async def async_post_call_response_headers_hook(self, data: dict, user_api_key_dict: Any, response: object,
                                                    request_headers: dict[str, str] | None = None,
                                                    litellm_call_info: dict[str, object] | None = None,
                                                    ) -> dict[str, str] | None:
        return response_headers(data)


def response_headers(data: dict) -> dict[str, str] | None:
    """The headers that say what prewarm's strategy decided for the request whose kwargs are `data`."""
    stamp = None
    for name in ("metadata", "litellm_metadata"):
        md = data.get(name)
        if isinstance(md, dict) and isinstance(md.get(STAMP), dict):
            stamp = md[STAMP]
            break
    if not stamp or not stamp.get("served_by"):
        return None
    out = {"x-prewarm-served-by": str(stamp["served_by"])}
    if stamp.get("gpu"):
        out["x-prewarm-gpu"] = str(stamp["gpu"])
    if stamp.get("fallback"):
        out["x-prewarm-fallback"] = str(stamp.get("model"))
    return out


def _from_env() -> PrewarmCallback:
    raw = os.environ.get("PREWARM_LITELLM_COLD_WAIT", "")
    try:
        cold_wait = float(raw) if raw.strip() else DEFAULT_COLD_WAIT_S
    except ValueError:
        raise ValueError(f"PREWARM_LITELLM_COLD_WAIT: seconds, a number, got {raw!r}") from None
    return PrewarmCallback(PrewarmRouting(os.environ.get("PREWARM_URL") or "http://127.0.0.1:8000",
                                          os.environ.get("PREWARM_HOOK_TOKEN") or None, cold_wait=cold_wait))


handler = _from_env()
