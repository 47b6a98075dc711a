"""The routing strategy: each LiteLLM pick asks prewarm where the model is warm (see the package docstring)."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from typing import Any

import litellm
from litellm.types.router import CustomRoutingStrategyBase, RouterRateLimitError

from prewarm.client import TrafficReporter
from prewarm.domain import states as rs

DEFAULT_COLD_WAIT_S = 30.0
PRIORITY_KEY = "priority"  # metadata["priority"]: high | normal | low, the lookup's on-demand preload priority
PRIORITIES = ("high", "normal", "low")
STAMP = "prewarm"  # metadata["prewarm"]: what the strategy decided for this request


class PrewarmRouting(CustomRoutingStrategyBase):
    """A LiteLLM custom routing strategy over prewarm's route answers.

    `url`, `token`: prewarm's web and its hook token (or hand in a `reporter` of your own).
    `cold_wait`: how long a request for a cold model with no fallback waits for a replica (seconds).
    `poll`: how often such a request asks again (`retry=1`, so prewarm counts the request once).
    `provider`: LiteLLM's provider for a replica's OpenAI-compatible endpoint (`hosted_vllm`: vLLM's server).
    `litellm_params`: extra parameters for every deployment it makes (`timeout`, `api_key`, ...).
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, reporter: TrafficReporter | None = None,
                 cold_wait: float = DEFAULT_COLD_WAIT_S, poll: float = 0.5, provider: str = "hosted_vllm",
                 litellm_params: dict[str, Any] | None = None, route_ttl: float = 1.0) -> None:
        if reporter is None and not url:
            raise ValueError("PrewarmRouting: give prewarm's url (http://host:port) or a TrafficReporter")
        if not (math.isfinite(cold_wait) and cold_wait >= 0):
            raise ValueError(f"cold_wait: seconds, a finite number >= 0, got {cold_wait!r}")
        if not (math.isfinite(poll) and poll > 0):
            raise ValueError(f"poll: seconds, a finite number > 0, got {poll!r}")
        if not provider or "/" in provider:
            raise ValueError(f"provider: a LiteLLM provider name such as 'hosted_vllm' or 'openai', got {provider!r}")
        self._own_reporter = reporter is None
        self.reporter = reporter or TrafficReporter(str(url), token, route_ttl=route_ttl)
        self.cold_wait = float(cold_wait)
        self.poll = float(poll)
        self.provider = provider
        self.litellm_params = dict(litellm_params or {})
        self._turn = itertools.count()  # takes tied replicas in turn (next() on a count is atomic in CPython)

    # --- LiteLLM's entry points ------------------------------------------------------------------------
    async def async_get_available_deployment(self, model: str, messages: list[dict[str, str]] | None = None,
                                             input: str | list[object] | None = None,
                                             specific_deployment: bool | None = False,
                                             request_kwargs: dict[str, object] | None = None) -> dict[str, Any]:
        retry = _retrying(request_kwargs)
        while True:
            # A ready answer is cached (no I/O); a repeat lookup of a cold model is a round trip: off the loop.
            got = await asyncio.to_thread(self._step, model, request_kwargs, retry) if retry \
                else self._step(model, request_kwargs, retry)
            if isinstance(got, dict):
                return got
            await asyncio.sleep(got)
            retry = True

    def get_available_deployment(self, model: str, messages: list[dict[str, str]] | None = None,
                                 input: str | list[object] | None = None, specific_deployment: bool | None = False,
                                 request_kwargs: dict[str, object] | None = None) -> dict[str, Any]:
        retry = _retrying(request_kwargs)
        while True:
            got = self._step(model, request_kwargs, retry)
            if isinstance(got, dict):
                return got
            time.sleep(got)
            retry = True

    def close(self) -> None:
        """Flush the reports still buffered (a reporter handed in is the caller's to close)."""
        if self._own_reporter:
            self.reporter.close()

    # --- one look at prewarm -----------------------------------------------------------------------------
    def _step(self, model: str, request_kwargs: dict[str, object] | None, retry: bool) -> dict[str, Any] | float:
        """A deployment for the request, or the seconds to sleep before asking again (cold, no fallback);
        raises LiteLLM's errors for what cannot be served."""
        stamp = _stamp(request_kwargs)
        priority = _priority(request_kwargs)
        answer = self.reporter.route(model, retry=retry, priority=priority)
        if answer.get("status") == 404:
            raise litellm.BadRequestError(
                message=f"prewarm: {model!r} is not a model in prewarm's catalog ({answer.get('error')})",
                model=model, llm_provider="prewarm")
        reported = stamp.setdefault("reported", [])
        if model not in reported:  # once per request (and per model a LiteLLM fallback moves it to)
            reported.append(model)
            self.reporter.report(model)
        stamp.update(model=model, state=answer.get("state"))
        replicas = answer.get("replicas") or []
        ready = [x for x in replicas if x.get("state") == rs.READY]
        if ready:
            served = [x for x in ready if x.get("endpoint")]
            if not served:
                raise litellm.BadRequestError(
                    message=f"prewarm: {model!r} is served through prewarm's infer queue (its runtime has no "
                            "HTTP endpoint); LiteLLM can only route to engine replicas (runtime vllm)",
                    model=model, llm_provider="prewarm")
            return self._deploy(model, model, self._least_busy(served), stamp, fallback=False)
        if answer.get("state") == "unknown":  # prewarm unreachable and nothing recent cached
            raise litellm.ServiceUnavailableError(message=f"prewarm: no route for {model!r}: {answer.get('error')}",
                                                  model=model, llm_provider="prewarm")
        eta = answer.get("eta_seconds")
        stamp["eta_seconds"] = eta
        via = self._fallback(model, answer.get("fallback"), stamp)
        if via is not None:
            return via
        now = time.monotonic()
        since = stamp.setdefault("cold_since", now)
        waited = now - since
        stamp["waited_s"] = round(waited, 3)
        if waited >= self.cold_wait:
            err = RouterRateLimitError(model=model, cooldown_time=float(math.ceil(eta or 1)),
                                       enable_pre_call_checks=False, cooldown_list=[])
            # The SDK caller reads it here; the proxy answers `cooldown_time` with Retry-After itself.
            err.litellm_response_headers = {"retry-after": str(math.ceil(eta or 1))}
            raise err
        return min(self.poll, self.cold_wait - waited)

    def _fallback(self, model: str, fb: Any, stamp: dict[str, Any]) -> dict[str, Any] | None:
        """The route answer's fallback as a deployment: a URL (`"http://..."` or `{"endpoint": URL}`) serving
        the model itself, or a catalog model with a ready replica; None when it has none to offer."""
        url = fb if isinstance(fb, str) else fb.get("endpoint") if isinstance(fb, dict) else None
        if url:
            return self._deploy(model, model, {"endpoint": url, "gpu": None, "version": None}, stamp, fallback=True)
        if not isinstance(fb, dict) or not fb.get("model"):
            return None
        served = [x for x in fb.get("replicas") or [] if x.get("state") == rs.READY and x.get("endpoint")]
        if not served:
            return None
        return self._deploy(model, str(fb["model"]), {**self._least_busy(served), "version": fb.get("version")},
                            stamp, fallback=True)

    def _least_busy(self, replicas: list[dict[str, Any]]) -> dict[str, Any]:
        """prewarm orders ready replicas least busy first; those as idle as the first are taken in turn, so
        a new replica gets its share at once (an engine's own requests do not show in prewarm's in_flight)."""
        first = replicas[0].get("in_flight") or 0
        tied = [x for x in replicas if (x.get("in_flight") or 0) <= first]
        return tied[next(self._turn) % len(tied)]

    def _deploy(self, group: str, served: str, replica: dict[str, Any], stamp: dict[str, Any], *,
                fallback: bool) -> dict[str, Any]:
        endpoint = str(replica["endpoint"]).rstrip("/")
        where = replica.get("gpu") or endpoint
        version = replica.get("version")
        stamp.update(served_by=served, version=version, gpu=replica.get("gpu"), endpoint=endpoint, fallback=fallback)
        # The engine serves the model under its catalog id; the id names the replica, so LiteLLM's client
        # cache and its per-deployment state follow a replica, not a model name.
        return {"model_name": group,
                "litellm_params": {**self.litellm_params, "model": f"{self.provider}/{served}", "api_base": endpoint},
                "model_info": {"id": f"prewarm:{served}@{version or '-'}:{where}", "prewarm": dict(stamp)}}


def _metadata(request_kwargs: dict[str, object] | None) -> dict[str, Any]:
    """The request's metadata dict, the caller's own object (LiteLLM hands it to every attempt's pick):
    `metadata` on the SDK, `litellm_metadata` where LiteLLM keeps its own beside a provider's."""
    if request_kwargs is None:
        return {}
    for name in ("metadata", "litellm_metadata"):
        md = request_kwargs.get(name)
        if isinstance(md, dict):
            return md
    md = request_kwargs["metadata"] = {}
    return md


def _stamp(request_kwargs: dict[str, object] | None) -> dict[str, Any]:
    """What the strategy decided for this request so far (its earlier attempts' picks). A caller may hand the
    same metadata dict to many requests: LiteLLM's trace id, the same for every attempt of one request and
    new for the next, tells them apart."""
    md = _metadata(request_kwargs)
    trace = (request_kwargs or {}).get("litellm_trace_id")
    stamp = md.get(STAMP)
    if not isinstance(stamp, dict) or stamp.get("request") != trace:
        stamp = md[STAMP] = {"request": trace}
    return stamp


def _retrying(request_kwargs: dict[str, object] | None) -> bool:
    """LiteLLM picks again for this request (an attempt failed): ask prewarm afresh, not from the cache (the
    replica tried may have gone within route_ttl), and as a repeat lookup (retry=1: counted once); a request
    that already waited for a cold model keeps its bound."""
    stamp = _stamp(request_kwargs)
    return "served_by" in stamp or "cold_since" in stamp


def _priority(request_kwargs: dict[str, object] | None) -> str | None:
    raw = _metadata(request_kwargs).get(PRIORITY_KEY)
    if raw is None:
        return None
    if raw not in PRIORITIES:
        raise litellm.BadRequestError(message=f"metadata.{PRIORITY_KEY}: one of {', '.join(PRIORITIES)}, got {raw!r}",
                                      model="", llm_provider="prewarm")
    return str(raw)


ROUTED_BY_PREWARM = "http://routed-by-prewarm.invalid/v1"  # a group entry's api_base: never dialled


def model_groups(models: list[str], provider: str = "hosted_vllm") -> list[dict[str, Any]]:
    """A `model_list` naming the catalog models LiteLLM serves, one entry each, for `Router(model_list=...)`
    (and the proxy's config). The entries are never dialled (`PrewarmRouting` makes each pick's deployment
    from prewarm's answer); LiteLLM wants a model group to exist before it retries a failed attempt, and
    the proxy before it accepts the model's name. Replicas coming and going never change it."""
    if isinstance(models, str) or not all(isinstance(m, str) and m for m in models):
        raise ValueError(f"models: a list of catalog model ids, got {models!r}")
    return [{"model_name": m, "litellm_params": {"model": f"{provider}/{m}", "api_base": ROUTED_BY_PREWARM},
             "model_info": {"id": f"prewarm-group:{m}"}} for m in models]
