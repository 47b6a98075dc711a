#!/usr/bin/env bash
# Installs LiteLLM's proxy (litellm[proxy]) into its own virtual environment: its pins fight prewarm's, and
# the proxy needs nothing of prewarm but the integration (prewarm/integrations/litellm, which imports only
# prewarm.client, standard library), found on PYTHONPATH from the checkout. Idempotent: a stamp file
# records what was installed; a second run with the same spec does nothing.
#
#   scripts/install-litellm-proxy.sh        # then: examples/litellm/README.md's second command
#   PREWARM_LITELLM_VENV=DIR ...            # where it goes (default ~/.cache/prewarm/litellm-proxy-<version>)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The version pyproject's `litellm` extra pins (the one the integration's tests pass against).
VERSION=$(sed -n 's/^litellm = \["litellm==\([^"]*\)"\]$/\1/p' "$ROOT/pyproject.toml")
[[ -n "$VERSION" ]] || { echo "install-litellm-proxy: no litellm pin found in pyproject.toml" >&2; exit 2; }
VENV=${PREWARM_LITELLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/prewarm/litellm-proxy-$VERSION}
PY=${PREWARM_PYTHON:-$(command -v python3.11 || command -v python3)}
spec="litellm[proxy]==$VERSION"
stamp="$VENV/.prewarm-litellm"
want="$spec $(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
if [[ -x "$VENV/bin/litellm" && -f "$stamp" && "$(head -n1 "$stamp")" == "$want" ]]; then
  echo "install-litellm-proxy: $spec already installed in $VENV" >&2
  echo "$VENV"
  exit 0
fi
echo "install-litellm-proxy: installing $spec into $VENV" >&2
rm -f "$stamp"  # a half-finished install must not look finished
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
# The proxy's own extra pulls litellm-proxy and litellm-proxy-extras at exactly matching versions; an index
# that lacks them (a mirror behind PyPI) gets LiteLLM itself and what its proxy server imports instead.
SERVER_DEPS=("gunicorn>=23,<24" "uvicorn>=0.33,<1" uvloop "fastapi>=0.136.3,<1" "starlette>=1.0.1,<2" backoff pyyaml
             rq orjson "apscheduler>=3.11.2,<4" fastapi-sso "pyjwt>=2.13" python-multipart cryptography pynacl
             "websockets>=15,<16" "mcp>=2.3,<3" azure-identity azure-storage-blob semver expression soundfile)
if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$spec"; then
  echo "install-litellm-proxy: $spec cannot be resolved here; installing litellm==$VERSION and the proxy server's imports" >&2
  spec="litellm==$VERSION + server deps"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "litellm==$VERSION" "${SERVER_DEPS[@]}"
fi
"$VENV/bin/python" -c 'import litellm.proxy.proxy_server' >/dev/null  # the check that counts: the proxy imports
printf '%s\n%s\n' "$want" "$spec" > "$stamp"
echo "install-litellm-proxy: LiteLLM's proxy $VERSION ready in $VENV" >&2
echo "$VENV"
