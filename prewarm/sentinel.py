"""PREWARM_REDIS_URL through Redis Sentinel: the one parser, and what it feeds.

    sentinel://[[USER]:PASSWORD@]HOST1:26379,HOST2:26379,HOST3:26379/MASTER_NAME/DB[?sentinel_password=...]
    sentinels://...   the same with TLS to the sentinels and to the master (ssl_cert_reqs, ssl_ca_certs,
                      ssl_certfile, ssl_keyfile in the query, as rediss:// takes them)

A host without a port is on 26379 (Sentinel's). The password is the master's (and its replicas'); the
sentinels get `sentinel_password` when they have their own (`requirepass` in sentinel.conf), else none.
DB defaults to 0 when left out.

One parse feeds prewarm's own client (`client`: redis-py's Sentinel(...).master_for(...), which asks the
sentinels for the master on every new connection, so a failover is followed by reconnecting) and Celery's
broker and result backend (`celery_config`: `sentinel://h1:p;sentinel://h2:p;...` URLs with
`master_name` and `sentinel_kwargs` in the transport options). A bad URL is a ConfigError that says what
to write; no message here carries a password.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.sentinel import Sentinel

from prewarm.config_errors import ConfigError, redacted

SCHEMES = ("sentinel", "sentinels")
DEFAULT_PORT = 26379
FORM = "sentinel://[:PASSWORD@]HOST1:26379,HOST2:26379,HOST3:26379/MASTER_NAME/DB"
_TLS_KEYS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_QUERY_KEYS = ("sentinel_password", *_TLS_KEYS)
# ssl_cert_reqs as written in a rediss:// or sentinels:// URL (celery_app.tls_options reads rediss:// with it)
CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


@dataclass(frozen=True)
class SentinelUrl:
    hosts: tuple[tuple[str, int], ...]  # the sentinels, (host, port)
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)
    tls: bool = False
    tls_query: dict[str, str] = field(default_factory=dict)  # the ssl_* parameters as written

    def ssl_options(self) -> dict[str, Any]:
        """redis-py's TLS keyword arguments (certificates verified unless ssl_cert_reqs=none)."""
        if not self.tls:
            return {}
        opts: dict[str, Any] = {"ssl": True, "ssl_cert_reqs": CERT_REQS[self.tls_query.get("ssl_cert_reqs", "required")]}
        for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            if key in self.tls_query:
                opts[key] = self.tls_query[key]
        return opts


def is_sentinel(url: str | None) -> bool:
    return bool(url) and url.split("://", 1)[0].lower() in SCHEMES  # type: ignore[union-attr]


def _refuse(url: str, why: str) -> ConfigError:
    return ConfigError(f"PREWARM_REDIS_URL={redacted(url)!r}: {why}; write {FORM} "
                       "(sentinels:// for TLS, ?sentinel_password=... for sentinels with their own password)")


def parse(url: str) -> SentinelUrl:
    """The parts of a sentinel:// or sentinels:// URL; ConfigError naming what is wrong and the form."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise _refuse(url, f"the scheme is {parts.scheme or '(none)'!r}, not sentinel or sentinels")
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon and secret else None
        if not colon:  # "pw@host": a user or a password? Sentinel URLs take only [USER]:PASSWORD@
            raise _refuse(url, "the part before @ has no ':'; write the password as :PASSWORD@")
    hosts = tuple(_host(url, h) for h in hostlist.split(","))
    path = [p for p in parts.path.split("/")]
    if len(path) < 2 or not path[1]:
        raise _refuse(url, "no master name after the sentinels")
    if len(path) > 3 or (len(path) == 3 and path[2] and not path[2].isdigit()):
        raise _refuse(url, f"{parts.path!r} is not /MASTER_NAME/DB with DB a whole number")
    master = unquote(path[1])
    db = int(path[2]) if len(path) == 3 and path[2] else 0
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = sorted(set(query) - set(_QUERY_KEYS))
    if unknown:
        raise _refuse(url, f"unknown parameter(s) {', '.join(unknown)} (known: {', '.join(_QUERY_KEYS)})")
    tls_query = {k: query[k] for k in _TLS_KEYS if k in query}
    if tls_query and scheme != "sentinels":
        raise _refuse(url, f"{', '.join(tls_query)} given without TLS: use sentinels://")
    reqs = tls_query.get("ssl_cert_reqs", "required").lower()
    if reqs not in ("required", "optional", "none"):
        raise _refuse(url, f"ssl_cert_reqs={reqs!r}; use required, optional or none")
    if "ssl_cert_reqs" in tls_query:
        tls_query["ssl_cert_reqs"] = reqs
    return SentinelUrl(hosts, master, db, username, password, query.get("sentinel_password") or None,
                       scheme == "sentinels", tls_query)


def _host(url: str, text: str) -> tuple[str, int]:
    text = text.strip()
    if not text:
        raise _refuse(url, "an empty host in the list of sentinels")
    if text.startswith("["):  # [::1]:26379
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if port_text and not port_text.isdigit():
        raise _refuse(url, f"sentinel {text!r}: the port must be a number")
    port = int(port_text) if port_text else DEFAULT_PORT
    if not host or not 0 < port < 65536:
        raise _refuse(url, f"sentinel {text!r} is not HOST:PORT")
    return host, port


def _sentinel_kwargs(u: SentinelUrl, timeout: float) -> dict[str, Any]:
    kw: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout, **u.ssl_options()}
    if u.sentinel_password:
        kw["password"] = u.sentinel_password
    return kw


def client(u: SentinelUrl, **kw: Any) -> redis.Redis:
    """prewarm's own client for the master the sentinels name now; every new connection asks them again,
    so after a failover the pool's reconnects reach the new master."""
    sentinel = Sentinel(list(u.hosts), sentinel_kwargs=_sentinel_kwargs(u, 1.0), **u.ssl_options())
    auth = {"password": u.password, **({"username": u.username} if u.username else {})}
    return sentinel.master_for(u.master, db=u.db, **auth, **kw)


def celery_config(u: SentinelUrl) -> dict[str, Any]:
    """Celery settings for the broker and result backend on the same sentinels and master (and kombu's
    `sentinel://` pointed at prewarm's fixed transport, prewarm.celery_transport)."""
    from prewarm import celery_transport

    celery_transport.install()
    cred = ""
    if u.password:
        cred = f"{u.username or ''}:{u.password}@"
    urls = ";".join(f"sentinel://{cred}{_netloc(h, p)}/{u.db}" for h, p in u.hosts)
    sentinel_kwargs: dict[str, Any] = {}
    if u.sentinel_password:
        sentinel_kwargs["password"] = u.sentinel_password
    if u.tls:
        sentinel_kwargs.update(u.ssl_options())
    options = {"master_name": u.master, "sentinel_kwargs": sentinel_kwargs}
    conf: dict[str, Any] = {
        "broker_url": urls, "result_backend": urls,
        # the worker's own kombu fix for a failover (prewarm.celery_transport)
        "broker_transport": celery_transport.NAME,
        "broker_transport_options": options,
        "result_backend_transport_options": dict(options),
    }
    if u.tls:
        ssl_opts: dict[str, Any] = {"ssl_cert_reqs": CERT_REQS[u.tls_query.get("ssl_cert_reqs", "required")]}
        ssl_opts.update({k: v for k, v in u.tls_query.items() if k != "ssl_cert_reqs"})
        conf["broker_use_ssl"] = ssl_opts
        conf["redis_backend_use_ssl"] = ssl_opts
    return conf


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
