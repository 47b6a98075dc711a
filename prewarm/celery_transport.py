"""kombu's Redis Sentinel transport with the failover fix the worker needs (the shape of kombu#582).

On a Sentinel failover the worker's broker connection breaks; Celery closes it and opens another. Closing
the channel gives its delivered-but-unacknowledged messages back (QoS.restore_unacked), which needs a
connection pool, and kombu's SentinelChannel builds one from `self.connection.client`, which kombu has
already set to None on the closed transport: `AttributeError: 'NoneType' object has no attribute 'hostname'`
from Channel.close -> restore_unacked -> _get_pool -> _connparams. Celery does not count an AttributeError
as a connection error, so the worker process exits ("Unrecoverable error").

Here the channel keeps the connection settings it was opened with and builds its pools from those, so the
restore reaches the new master; and a close that still fails (no master elected yet) is logged, not
raised: closing is cleanup, the messages stay in kombu's unacked set, and the consumer reconnects and goes
on consuming in the same process. An ack of a task that finished after its channel was closed fails as a
connection error (Celery logs "Couldn't ack" and goes on), not as the same AttributeError. `prewarm.sentinel.celery_config` names this transport for the broker.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

log = logging.getLogger("prewarm.worker")


class SentinelChannel(kombu_redis.SentinelChannel):
    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        # Before super().__init__: it may build the pool already. `client` is the kombu Connection whose
        # settings (hosts, password, TLS, transport options) every pool of this channel is made from.
        self._opened_with = connection.client
        super().__init__(connection, *args, **kwargs)

    @contextlib.contextmanager
    def _settings(self) -> Iterator[None]:
        """The transport's `client` for the length of a pool build, put back if kombu dropped it on close."""
        transport = self.connection
        if transport is None:
            # The channel itself is closed: an ack of a task that finished after the failover broke it. A
            # connection error is what Celery logs ("Couldn't ack") and survives; the message stays unacked.
            raise redis.ConnectionError("the broker channel was closed (a Redis failover?); not acknowledged")
        dropped = transport.client is None and self._opened_with is not None
        if dropped:
            transport.client = self._opened_with
        try:
            yield
        finally:
            if dropped:
                transport.client = None

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        with self._settings():
            return super()._connparams(asynchronous)

    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        with self._settings():
            return super()._sentinel_managed_pool(asynchronous)

    def close(self) -> None:
        try:
            super().close()
        except Exception as exc:  # noqa: BLE001 - see the module docstring: never fatal to the worker
            log.warning("broker channel closed with an error (a failover under way?): %s: %s; its unacknowledged "
                        "messages stay in the broker's unacked set; reconnecting", type(exc).__name__, exc)
            self._closing = True
            with contextlib.suppress(Exception):
                self._disconnect_pools()
            self.closed = True
            with contextlib.suppress(Exception):
                self.connection.close_channel(self)


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


NAME = f"{__name__}:SentinelTransport"


def install() -> None:
    """Make this transport what `sentinel://` means to kombu in this process. Naming it in Celery's
    `broker_transport` is not enough: when a connection fails, kombu switches to the next of the broker's
    `sentinel://...;sentinel://...` URLs and takes the transport from that URL's scheme again (the stock
    one, with the bug), so the scheme itself is pointed here."""
    from kombu import transport

    transport.TRANSPORT_ALIASES["sentinel"] = NAME
    transport._transport_cache.pop("sentinel", None)  # resolved before (e.g. by an earlier Connection)
