"""Process configuration, read from the environment (see ../shared/DESIGN.md).

Every process (web, scheduler, worker, CLI) reads the same variables through `Settings.from_env()`,
so a value means the same thing everywhere.
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from prewarm import sentinel
from prewarm.arg_types import MAX_PORT
from prewarm.config_errors import MASK, ConfigError, redacted
from prewarm.domain import policy_names
from prewarm.domain.slo import ColdStartSlo
from prewarm.units import parse_bytes, parse_duration


@dataclass(frozen=True)
class DeviceSpec:
    """One device a worker serves: `cuda:0`, or `cpu:0` with a memory budget (a CPU virtual GPU)."""

    device: str
    budget_bytes: int | None  # None: the device's own capacity (CUDA)

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


DEFAULT_CPU_BUDGET = 4 * 1024**3


def parse_devices(text: str | None) -> list[DeviceSpec]:
    """Parse PREWARM_DEVICES: 'cpu:0=4GiB,cpu:1=4GiB' or 'cuda:0,cuda:1' or 'cuda:0=20GiB'.

    Unset: every CUDA device when present, else one CPU virtual GPU with a 4 GiB budget.
    """
    if not text:
        return default_devices()
    specs: list[DeviceSpec] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, budget = part.partition("=")
        name = name.strip()
        if not re.fullmatch(r"(cpu|cuda):[0-9]+", name):
            raise ConfigError(f"PREWARM_DEVICES: {name!r} is not a device; write cpu:N=SIZE or cuda:N[=SIZE]")
        if name.startswith("cpu") and not budget:
            budget_bytes: int | None = DEFAULT_CPU_BUDGET
        else:
            budget_bytes = parse_bytes(budget) if budget else None
        specs.append(DeviceSpec(name, budget_bytes))
    if len({s.device for s in specs}) != len(specs):
        raise ConfigError(f"PREWARM_DEVICES: a device is listed twice in {text!r}")
    return specs


def default_devices() -> list[DeviceSpec]:
    try:  # torch is imported only where a worker runs; web and scheduler never get here.
        import torch

        if torch.cuda.is_available():
            return [DeviceSpec(f"cuda:{i}", None) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return [DeviceSpec("cpu:0", DEFAULT_CPU_BUDGET)]


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def default_data_dir() -> Path:
    return Path(os.environ.get("PREWARM_DATA_DIR") or repo_root() / "var")


def parse_idle_memory_budget(text: str | None, name: str = "PREWARM_IDLE_MEMORY_BUDGET") -> float | None:
    """The share of each GPU that replicas with no expected demand may hold: '0.25' or '25%';
    unset, empty or 'unlimited': None (no budget: such replicas are evicted only when a load needs
    their memory)."""
    t = (text or "").strip().lower()
    if t in ("", "unlimited", "none"):
        return None
    try:
        v = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        v = math.nan
    if not 0.0 <= v <= 1.0:  # NaN fails too
        raise ConfigError(f"{name}={text!r}: write a share of each GPU from 0 to 1 (e.g. 0.25 or 25%), "
                         "or 'unlimited'")
    return v


MIN_SECRET_KEY_CHARS = 32

def env_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A duration variable (2, 2s, 5m, 1h), more than 0 seconds; the error names the variable."""
    raw = env.get(name)
    if not raw:
        return default
    try:
        v = parse_duration(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r}: {exc}") from None
    if v <= 0:
        raise ConfigError(f"{name}={raw!r}: write a duration above 0, e.g. {default:g}s")
    return v


def env_int(env: Mapping[str, str], name: str, default: int, low: int = 1, example: int | None = None,
            high: int | None = None) -> int:
    """A whole-number variable, at least `low` (and at most `high`); the error names the variable (and `example`,
    else the default, as a value to write)."""
    raw = env.get(name)
    if not raw:
        return default
    span = f"of {low} or more" if high is None else f"from {low} to {high}"
    hint = f"{name}={raw!r}: write a whole number {span}, e.g. {default if example is None else example}"
    try:
        v = int(raw.strip())
    except ValueError:
        raise ConfigError(hint) from None
    if v < low or (high is not None and v > high):
        raise ConfigError(hint)
    return v


def env_flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    """An on/off variable: 1, true, yes, on (any case) is on; 0, false, no, off is off; unset or blank
    is `default`."""
    raw = (env.get(name) or "").strip().lower()
    if raw == "":
        return default
    if raw in ("0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name}={raw!r}: write 1 (on) or 0 (off)")


def env_stale_rate(env: Mapping[str, str], name: str) -> str:
    """PolicyConfig.refute_stale_rate's reading: auto (unset or blank), or an on/off flag as env_flag reads it."""
    raw = (env.get(name) or "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    try:
        return "on" if env_flag(env, name) else "off"
    except ConfigError:
        raise ConfigError(f"{name}={raw!r}: write auto, 1 (on) or 0 (off)") from None


def env_float(env: Mapping[str, str], name: str, default: float) -> float:
    """A finite number variable (its range is checked where the setting is); the error names the variable."""
    raw = env.get(name)
    if not raw:
        return default
    try:
        v = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: write a number, e.g. {default:g}") from None
    if not math.isfinite(v):
        raise ConfigError(f"{name}={raw!r}: write a finite number, e.g. {default:g}")
    return v


def parse_max_demand_wait(text: str | None, name: str = "PREWARM_MAX_DEMAND_WAIT") -> float | None:
    """How long a request may wait for its model before the policy serves it next: '60s', '2m', '90';
    unset, empty or 'off': None (the rule is off)."""
    t = (text or "").strip().lower()
    if t in ("", "off", "none"):
        return None
    try:
        v = parse_duration(t)
    except ValueError:
        v = 0.0
    if v <= 0:
        raise ConfigError(f"{name}={text!r}: write a positive duration such as 60s or 2m, or 'off'")
    return v


_SLO_HELP = "write share=0.05,window=15m or p95=10s (window optional, default 15m)"


def parse_slo(text: str | None, name: str = "PREWARM_COLD_START_SLO") -> ColdStartSlo | None:
    """Parse PREWARM_COLD_START_SLO (or the option `name`); None when unset or empty. ValueError says what to
    write."""
    if not text or not text.strip():
        return None
    fields: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in ("share", "p95", "window") or not value.strip():
            raise ConfigError(f"{name}={text!r}: cannot read {part!r}; {_SLO_HELP}")
        if key in fields:
            raise ConfigError(f"{name}={text!r}: {key} is given twice; {_SLO_HELP}")
        fields[key] = value.strip()
    if ("share" in fields) == ("p95" in fields):
        raise ConfigError(f"{name}={text!r}: give exactly one of share or p95; {_SLO_HELP}")
    try:
        window = parse_duration(fields.get("window", "15m"))
        if "share" in fields:
            metric, target = "share", float(fields["share"].rstrip("%")) / (100 if fields["share"].endswith("%")
                                                                            else 1)
        else:
            metric, target = "p95", parse_duration(fields["p95"])
    except ValueError as exc:
        raise ConfigError(f"{name}={text!r}: {exc}; {_SLO_HELP}") from None
    if metric == "share" and not 0.0 < target < 1.0:
        raise ConfigError(f"{name}={text!r}: share {target:g} must lie between 0 and 1, e.g. 0.05")
    if target <= 0 or window < 60:
        raise ConfigError(f"{name}={text!r}: the target must be positive and the window at "
                         "least 1m (the scheduler measures it per minute)")
    return ColdStartSlo(metric, target, window)


REDIS_SCHEMES = ("redis", "rediss", "unix")  # what redis-py connects to; sentinel.SCHEMES beside them
DEFAULT_WEB_HOST = "127.0.0.1"  # loopback: exposing the web is the operator's explicit choice


@dataclass(frozen=True)
class Settings:
    """Every secret is masked in repr/str (`__repr__`): settings get logged and printed in tracebacks."""

    redis_url: str | None
    catalog: Path
    node: str
    port: int
    devices_text: str | None
    data_dir: Path
    hook_token: str | None
    admin_token: str | None
    tick_seconds: float
    heartbeat_seconds: float
    heartbeat_ttl: float
    intent_ttl: float
    leader_ttl: float
    event_log_max: int
    speculative_share: float
    # loads one GPU runs at once: the worker queues more, and the policy sends no more (a load
    # waits for whichever GPU's link frees first instead of slowing the ones in flight)
    max_loads_per_gpu: int
    # share of each GPU that replicas with no expected demand may hold (None: unlimited)
    idle_memory_budget: float | None = None
    # PREWARM_MAX_DEMAND_WAIT: a request waiting this long is served next (PolicyConfig.overdue_wait_s)
    max_demand_wait: float | None = None
    # PREWARM_NO_REGRET: the no-regret layer (PolicyConfig.no_regret; experts.py, duels.py): on unless set to 0
    no_regret: bool = True
    # PREWARM_WHOLE_EXPERTS: with the layer on, a whole baseline whose shadow fleet leads may plan
    # (PolicyConfig.whole_experts; prewarm.domain.whole). On unless set to 0: its shadows pay the fleet's measured
    # delay before a demand load (Snapshot.demand_delay_s) from the start, and each expert its fleet's overhead once
    # it has planned, so a lead is not a live cold start's unmodelled delays
    whole_experts: bool = True
    # PREWARM_LINK_WAIT: a demand load waits for a busy link where that costs fewer cold requests than sharing it
    # (PolicyConfig.link_wait), and the route hook's on-demand load takes an idle link only. On unless set to 0
    link_wait: bool = True
    # PREWARM_REFUTE_STALE_RATE: a model whose stream has stopped (a silence implausible at its measured rate) is valued
    # by its idle-time model, not by the rate it had (PolicyConfig.refute_stale_rate): auto (the default: while the
    # fleet's record says such silences are mostly stops), on (1) or off (0)
    refute_stale_rate: str = "auto"
    # PREWARM_FILL_SHARE: the share of each GPU the fill of never-requested models may take while fills pay
    # (PolicyConfig.fill_share; firsts.py); 0: no fill
    fill_share: float = 1.0
    # signs console session cookies; None: a random key kept in Redis (keys.SESSION_SECRET)
    secret_key: str | None = None
    # wrong tries of the admin token (console login or API bearer), and apart of the hook token, allowed
    # per 10-minute window from one client address and from all clients together (web.throttle)
    login_max_failures: int = 10
    login_max_failures_global: int = 100
    cold_start_slo: ColdStartSlo | None = None  # None: the speculative budget stays where it is set
    # price of one GPU-hour of memory, for /api/roi (0: memory-time shown in GiB·h only)
    gpu_hour_cost: float = 0.0
    # the scheduler's policy (PREWARM_POLICY): prewarm's plan or one of the baselines, prewarm.domain.policy_names
    policy: str = policy_names.DEFAULT
    # the address `prewarm web` binds (PREWARM_WEB_HOST; `prewarm web --host` wins)
    web_host: str = DEFAULT_WEB_HOST
    # -- the processes' own knobs (each command's flag wins where it has one) --
    web_workers: int = 2  # PREWARM_WEB_WORKERS: gunicorn worker processes of `prewarm web`
    scheduler_metrics_port: int = 0  # PREWARM_SCHEDULER_METRICS_PORT: the scheduler's /metrics (0: off)
    scheduler_metrics_host: str = DEFAULT_WEB_HOST  # PREWARM_SCHEDULER_METRICS_HOST: the address it binds
    worker_threads: int | None = None  # PREWARM_WORKER_THREADS: task threads (None: 4 per GPU, at least 8)
    # -- the GPU worker's (gpu_worker.held.WorkerOptions) --
    warmup_max_passes: int = 10  # PREWARM_WARMUP_MAX_PASSES
    warmup_max_seconds: float = 5.0  # PREWARM_WARMUP_MAX_SECONDS
    failed_retention_seconds: float = 600.0  # PREWARM_FAILED_RETENTION_SECONDS: a failed replica's record
    load_threads: int | None = None  # PREWARM_LOAD_THREADS: reader threads per load (None: the loader's)
    load_pace_bytes_per_s: float | None = None  # PREWARM_LOAD_PACE_BYTES_PER_S: a slowed load, for demos
    cpu_device_arena: bool = False  # PREWARM_CPU_DEVICE_ARENA: a CPU virtual GPU as one pre-faulted arena
    host_cache: str | None = None  # PREWARM_HOST_CACHE: 16GiB or 25% of RAM (None: a quarter)
    advertise_host: str | None = None  # PREWARM_ADVERTISE_HOST: where routers reach this node's engines
    # PREWARM_REDIS_WAIT_REPLICAS: replicas that must confirm a hook's write before its 202 (prewarm.replicated)
    redis_wait_replicas: int = 0
    # PREWARM_DRAIN_GRACE: how long a draining worker waits for its replicas' replacements before it evicts
    # them anyway and exits (keep it under the pod's terminationGracePeriodSeconds)
    drain_grace: float = 300.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        data_dir = Path(e.get("PREWARM_DATA_DIR") or default_data_dir())
        return cls(
            redis_url=e.get("PREWARM_REDIS_URL") or None,
            catalog=Path(e.get("PREWARM_CATALOG") or data_dir / "demo-models" / "catalog.toml"),
            node=e.get("PREWARM_NODE") or socket.gethostname(),
            port=env_int(e, "PORT", 8000, high=MAX_PORT),
            devices_text=e.get("PREWARM_DEVICES") or None,
            data_dir=data_dir,
            hook_token=e.get("PREWARM_HOOK_TOKEN") or None,
            admin_token=e.get("PREWARM_ADMIN_TOKEN") or None,
            tick_seconds=env_seconds(e, "PREWARM_TICK_SECONDS", 2.0),
            heartbeat_seconds=env_seconds(e, "PREWARM_HEARTBEAT_SECONDS", 2.0),
            heartbeat_ttl=env_seconds(e, "PREWARM_HEARTBEAT_TTL", 10.0),
            intent_ttl=env_seconds(e, "PREWARM_INTENT_TTL", 120.0),
            leader_ttl=env_seconds(e, "PREWARM_LEADER_TTL", 10.0),
            event_log_max=env_int(e, "PREWARM_EVENT_LOG_MAX", 5000),
            speculative_share=env_float(e, "PREWARM_SPECULATIVE_SHARE", 0.6),
            max_loads_per_gpu=env_int(e, "PREWARM_MAX_LOADS_PER_GPU", 2),
            idle_memory_budget=parse_idle_memory_budget(e.get("PREWARM_IDLE_MEMORY_BUDGET")),
            max_demand_wait=parse_max_demand_wait(e.get("PREWARM_MAX_DEMAND_WAIT")),
            no_regret=env_flag(e, "PREWARM_NO_REGRET", True),
            whole_experts=env_flag(e, "PREWARM_WHOLE_EXPERTS", True),
            link_wait=env_flag(e, "PREWARM_LINK_WAIT", True),
            refute_stale_rate=env_stale_rate(e, "PREWARM_REFUTE_STALE_RATE"),
            fill_share=env_float(e, "PREWARM_FILL_SHARE", 1.0),
            secret_key=e.get("PREWARM_SECRET_KEY") or None,
            login_max_failures=env_int(e, "PREWARM_LOGIN_MAX_FAILURES", 10),
            login_max_failures_global=env_int(e, "PREWARM_LOGIN_MAX_FAILURES_GLOBAL", 100),
            cold_start_slo=parse_slo(e.get("PREWARM_COLD_START_SLO")),
            gpu_hour_cost=env_float(e, "PREWARM_GPU_HOUR_COST", 0.0),
            policy=(e.get("PREWARM_POLICY") or policy_names.DEFAULT).strip(),
            web_host=(e.get("PREWARM_WEB_HOST") or "").strip() or DEFAULT_WEB_HOST,  # blank would bind all
            web_workers=env_int(e, "PREWARM_WEB_WORKERS", 2),
            scheduler_metrics_port=env_int(e, "PREWARM_SCHEDULER_METRICS_PORT", 0, low=0, example=9108, high=MAX_PORT),
            scheduler_metrics_host=(e.get("PREWARM_SCHEDULER_METRICS_HOST") or "").strip() or DEFAULT_WEB_HOST,
            worker_threads=env_int(e, "PREWARM_WORKER_THREADS", 0, example=8) or None,
            warmup_max_passes=env_int(e, "PREWARM_WARMUP_MAX_PASSES", 10, low=0),
            warmup_max_seconds=env_seconds(e, "PREWARM_WARMUP_MAX_SECONDS", 5.0),
            failed_retention_seconds=env_seconds(e, "PREWARM_FAILED_RETENTION_SECONDS", 600.0),
            load_threads=env_int(e, "PREWARM_LOAD_THREADS", 0, example=4) or None,
            load_pace_bytes_per_s=env_float(e, "PREWARM_LOAD_PACE_BYTES_PER_S", 0.0) or None,
            cpu_device_arena=env_flag(e, "PREWARM_CPU_DEVICE_ARENA"),
            host_cache=(e.get("PREWARM_HOST_CACHE") or "").strip() or None,
            advertise_host=(e.get("PREWARM_ADVERTISE_HOST") or "").strip() or None,
            redis_wait_replicas=env_int(e, "PREWARM_REDIS_WAIT_REPLICAS", 0, low=0, example=1),
            drain_grace=env_seconds(e, "PREWARM_DRAIN_GRACE", 300.0),
        )

    _SECRETS = ("hook_token", "admin_token", "secret_key")

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self._SECRETS and value is not None:
                value = MASK
            elif f.name == "redis_url" and value is not None:
                value = redacted(value)
            shown.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    def __post_init__(self) -> None:
        policy_names.check(self.policy)
        if self.redis_url is not None:
            if sentinel.is_sentinel(self.redis_url):
                sentinel.parse(self.redis_url)  # a bad sentinel:// URL is refused now, in words
            elif self.redis_url.split("://", 1)[0].lower() not in REDIS_SCHEMES or "://" not in self.redis_url:
                # else redis-py's ValueError at the first connection, a traceback in every process
                raise ConfigError(f"PREWARM_REDIS_URL={redacted(self.redis_url)!r}: write redis://HOST:6379/0, "
                                  f"rediss:// (TLS), unix:///PATH/redis.sock or {sentinel.FORM}")
        if not 0.0 <= self.speculative_share <= 1.0:
            raise ConfigError(f"PREWARM_SPECULATIVE_SHARE={self.speculative_share}: write a share from 0 to 1, "
                             "e.g. 0.6")
        if not 0.0 <= self.fill_share <= 1.0:
            raise ConfigError(f"PREWARM_FILL_SHARE={self.fill_share}: write a share from 0 to 1, e.g. 1 (all free "
                             "memory while fills pay) or 0 (no fill)")
        if self.secret_key is not None and len(self.secret_key) < MIN_SECRET_KEY_CHARS:
            raise ConfigError(f"PREWARM_SECRET_KEY: {len(self.secret_key)} characters is too short to sign "
                             f"sessions; use at least {MIN_SECRET_KEY_CHARS} random characters, e.g. the output of "
                             "python3 -c 'import secrets; print(secrets.token_urlsafe(32))', or unset it")
        if not math.isfinite(self.gpu_hour_cost) or self.gpu_hour_cost < 0:
            raise ConfigError(f"PREWARM_GPU_HOUR_COST={self.gpu_hour_cost}: write the price of one GPU-hour, "
                             "0 or more, e.g. 2.5")
        for name, value in (("PREWARM_LOGIN_MAX_FAILURES", self.login_max_failures),
                            ("PREWARM_LOGIN_MAX_FAILURES_GLOBAL", self.login_max_failures_global)):
            if value < 1:
                raise ConfigError(f"{name}={value}: write a number of failed logins of at least 1, e.g. 10")

    def devices(self) -> list[DeviceSpec]:
        return parse_devices(self.devices_text)
