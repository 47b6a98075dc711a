# Sourced by ./run and ./test: creates .venv and installs prewarm on first use (and again when
# pyproject.toml changes), so a fresh machine needs nothing but Python 3.11.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
PY=${PREWARM_PYTHON:-$(command -v python3.11 || command -v python3)}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "prewarm needs Python 3.11 (found $("$PY" --version)); set PREWARM_PYTHON" >&2
  exit 1
fi
stamp="$VENV/.prewarm-installed"
want=$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)
if [[ ! -x "$VENV/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "prewarm: setting up $VENV (first use; torch is pinned to the CPU build 2.13.0)" >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[dev]"
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
# The policy's native (mypyc) build for the current sources: compiled when missing (about 15 s),
# skipped with a note where there is no compiler (the policy then runs as pure Python).
"$VENV/bin/python" -m prewarm.domain.policy ensure
