"""PREWARM_REDIS_URL=sentinel://...: the one parser, what it feeds Celery, and the URLs it refuses in words."""

from __future__ import annotations

import ssl

import pytest

from prewarm import sentinel
from prewarm.celery_app import make_celery
from prewarm.config import Settings
from prewarm.config_errors import ConfigError, redacted


def test_the_documented_form_parses() -> None:
    u = sentinel.parse("sentinel://:s3cret@h1:26379,h2:26380,h3:26381/mymaster/2")
    assert u.hosts == (("h1", 26379), ("h2", 26380), ("h3", 26381))
    assert (u.master, u.db, u.password, u.username, u.sentinel_password, u.tls) == ("mymaster", 2, "s3cret", None,
                                                                                    None, False)


def test_the_deploy_manifest_form_parses_ports_defaulting_to_26379() -> None:
    # deploy/k8s/web.yaml writes hosts without ports after the first
    u = sentinel.parse("sentinel://:pw@prewarm-redis-0.prewarm-redis-headless:26379,h2,h3/prewarm/0")
    assert u.hosts == (("prewarm-redis-0.prewarm-redis-headless", 26379), ("h2", 26379), ("h3", 26379))
    assert (u.master, u.db, u.password) == ("prewarm", 0, "pw")


def test_no_password_a_user_ipv6_and_a_missing_db() -> None:
    u = sentinel.parse("sentinel://[::1]:26379,127.0.0.1/prewarm")
    assert u.hosts == (("::1", 26379), ("127.0.0.1", 26379)) and u.db == 0 and u.password is None
    assert sentinel.parse("sentinel://app:pw@h1/prewarm/0").username == "app"


def test_sentinel_password_and_tls() -> None:
    u = sentinel.parse("sentinels://:pw@h1,h2/prewarm/0?sentinel_password=sp&ssl_ca_certs=/ca.pem")
    assert u.tls and u.sentinel_password == "sp"
    assert u.ssl_options() == {"ssl": True, "ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/ca.pem"}


def test_celery_gets_every_sentinel_the_master_name_and_the_sentinel_password() -> None:
    app = make_celery("sentinel://:pw@127.0.0.1:26379,127.0.0.1:26380/prewarm/3?sentinel_password=sp")
    assert app.conf.broker_url == "sentinel://:pw@127.0.0.1:26379/3;sentinel://:pw@127.0.0.1:26380/3"
    assert app.conf.result_backend == app.conf.broker_url
    opts = app.conf.broker_transport_options
    assert opts["master_name"] == "prewarm" and opts["sentinel_kwargs"] == {"password": "sp"}
    assert opts["visibility_timeout"] == 3600  # prewarm's own options are kept beside Sentinel's
    assert app.conf.result_backend_transport_options["master_name"] == "prewarm"
    assert app.conf.broker_transport == "prewarm.celery_transport:SentinelTransport"


def test_every_sentinel_url_gets_the_fixed_transport_also_after_kombu_switches_to_the_next() -> None:
    from kombu import Connection

    from prewarm.celery_transport import SentinelTransport

    app = make_celery("sentinel://127.0.0.1:26379,127.0.0.1:26380/prewarm/0")
    conn = app.connection_for_read()
    assert conn.get_transport_cls() is SentinelTransport
    conn.switch("sentinel://127.0.0.1:26380/0")  # what kombu does after a connection error
    assert conn.get_transport_cls() is SentinelTransport
    assert Connection("sentinel://127.0.0.1:26381/0").get_transport_cls() is SentinelTransport


def test_celery_over_tls_to_sentinels_and_master() -> None:
    app = make_celery("sentinels://h1/prewarm/0?ssl_cert_reqs=none")
    assert app.conf.broker_use_ssl == {"ssl_cert_reqs": ssl.CERT_NONE}
    assert app.conf.broker_transport_options["sentinel_kwargs"]["ssl"] is True


@pytest.mark.parametrize(("url", "says"), [
    ("sentinel://:pw@h1,h2/", "no master name"),
    ("sentinel://:pw@h1,h2", "no master name"),
    ("sentinel://h1:port/prewarm/0", "the port must be a number"),
    ("sentinel://h1,,h3/prewarm/0", "an empty host"),
    ("sentinel://h1/prewarm/zero", "DB a whole number"),
    ("sentinel://h1/prewarm/0/extra", "DB a whole number"),
    ("sentinel://pw@h1/prewarm/0", "write the password as :PASSWORD@"),
    ("sentinel://h1/prewarm/0?ssl_ca_certs=/ca.pem", "use sentinels://"),
    ("sentinel://h1/prewarm/0?master=x", "unknown parameter(s) master"),
    ("sentinels://h1/prewarm/0?ssl_cert_reqs=maybe", "use required, optional or none"),
])
def test_a_bad_url_is_refused_with_what_to_write(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        sentinel.parse(url)
    assert says in str(err.value)
    assert sentinel.FORM in str(err.value)  # ...and the form to write instead


def test_settings_refuse_a_bad_sentinel_url_without_printing_its_password() -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"PREWARM_REDIS_URL": "sentinel://:topsecret@h1,h2/"})
    assert "topsecret" not in str(err.value) and "PREWARM_REDIS_URL" in str(err.value)


def test_passwords_are_masked() -> None:
    assert redacted("sentinel://:pw@h1:26379,h2,h3/prewarm/0?sentinel_password=sp") == \
        "sentinel://:***@h1:26379,h2,h3/prewarm/0?sentinel_password=***"
    s = Settings.from_env({"PREWARM_REDIS_URL": "sentinel://:pw@h1,h2/prewarm/0?sentinel_password=sp"})
    assert ":pw@" not in repr(s) and "=sp" not in repr(s) and ":***@" in repr(s)


def test_redis_urls_are_not_sentinel_urls() -> None:
    assert not sentinel.is_sentinel("redis://h1/0") and not sentinel.is_sentinel(None)
    assert sentinel.is_sentinel("SENTINEL://h1/prewarm")


@pytest.mark.parametrize("url", ["garbage", "http://h1:6379/0", "127.0.0.1:6379", "redis:/h1"])
def test_settings_refuse_a_url_redis_cannot_connect_to_naming_the_forms(url: str) -> None:
    # was redis-py's "Redis URL must specify one of the following schemes" at the first connection, a traceback
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"PREWARM_REDIS_URL": url})
    assert "PREWARM_REDIS_URL" in str(err.value) and "redis://HOST:6379/0" in str(err.value)
    assert sentinel.FORM in str(err.value)


@pytest.mark.parametrize("url", ["redis://h1:6379/0", "REDIS://h1/0", "rediss://:pw@h1:6380/1", "unix:///run/r.sock"])
def test_settings_take_every_url_redis_connects_to(url: str) -> None:
    assert Settings.from_env({"PREWARM_REDIS_URL": url}).redis_url == url
