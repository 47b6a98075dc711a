"""ConfigError, the error of a PREWARM_* value that cannot be used, and `redacted`, which masks the secrets
of a URL for its messages. A leaf (nothing of prewarm imported): prewarm.config and prewarm.sentinel both
use them, and config imports sentinel.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


class ConfigError(ValueError):
    """A PREWARM_* variable that cannot be used; the message names it and says what to write."""


MASK = "***"
# URL query parameters redis-py passes on as connection options that hold a secret (a password, the TLS
# key's passphrase ssl_password): masked by `redacted` like the password in the netloc.
_SECRET_QUERY = re.compile(r"pass|secret|token", re.IGNORECASE)


def redacted(url: str) -> str:
    """`url` with its password (if any), and any query parameter holding a secret, replaced by ***: fit for
    messages, logs and repr."""
    parts = urlsplit(url)
    if parts.password is not None:
        # by hand on the netloc: a sentinel:// URL lists several hosts, which urlsplit's port cannot read
        userinfo, _, hosts = parts.netloc.rpartition("@")
        url = urlunsplit(parts._replace(netloc=f"{userinfo.partition(':')[0]}:{MASK}@{hosts}"))
    base, mark, rest = url.partition("?")  # by hand: urlunsplit would drop unix:///'s empty netloc
    query, hash_, fragment = rest.partition("#")
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(_SECRET_QUERY.search(k) for k, _ in pairs):
        return url
    masked = urlencode([(k, MASK if _SECRET_QUERY.search(k) else v) for k, v in pairs], safe="*")
    return f"{base}{mark}{masked}{hash_}{fragment}"
