#!/usr/bin/env bash
# Makes the Python venv the OpenAI-compatible HTTP API's tests drive the server from:
# $TANDEM_OPENAI_VENV (default ~/.cache/tandem/venv-openai) with the official `openai`
# client and its dependencies at the versions and sha256 hashes of
# scripts/openai-requirements.txt (pip install --require-hashes). Idempotent: a venv whose
# stamp matches the requirements file is left as it is (~0.1 s); otherwise it is (re)made.
# Prints the venv's python last; exits non-zero, saying why, if the venv cannot be made.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQS="$ROOT/scripts/openai-requirements.txt"
VENV="${TANDEM_OPENAI_VENV:-$HOME/.cache/tandem/venv-openai}"
PY="$VENV/bin/python"
STAMP="$VENV/.tandem-requirements.sha256"
say() { printf 'openai-venv: %s\n' "$*" >&2; }

want="$(sha256sum "$REQS" | cut -d' ' -f1)" || { say "error: cannot read $REQS"; exit 1; }
if [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ] && "$PY" -c 'import openai' >/dev/null 2>&1; then
  echo "$PY"
  exit 0
fi
# Never clear a directory that is not a venv (a mistyped TANDEM_OPENAI_VENV).
if [ -e "$VENV" ] && [ ! -e "$VENV/pyvenv.cfg" ] && [ -n "$(ls -A "$VENV" 2>/dev/null)" ]; then
  say "error: $VENV exists and is not a venv; remove it or set TANDEM_OPENAI_VENV"; exit 1
fi
say "installing the pinned openai client into $VENV"
python3 -m venv --clear "$VENV" || { say "error: python3 -m venv $VENV failed (is python3-venv installed?)"; exit 1; }
"$PY" -m pip install --quiet --disable-pip-version-check --require-hashes --only-binary=:all: \
  -r "$REQS" || { say "error: pip install --require-hashes -r $REQS failed"; exit 1; }
version="$("$PY" -c 'import openai; print(openai.__version__)')" \
  || { say "error: openai does not import in $VENV"; exit 1; }
pinned="$(sed -n 's/^openai==\([^ ]*\).*/\1/p' "$REQS")"
[ "$version" = "$pinned" ] || { say "error: openai $version installed, $pinned pinned"; exit 1; }
echo "$want" >"$STAMP"
say "openai $version in $VENV"
echo "$PY"
