#!/usr/bin/env bash
# The evaluation sets through `tandem bench speculative` on the lent H200 (target in bf16,
# the drafter on the GPU beside it), after train-broad.sh's `stage` calls have put the
# binary, the models and the drafter under /tmp/w. One JSON report per set and mode to
# $OUT, written as each finishes (eight at most come back: the adaptive draft length runs
# on the chat, prose and docs sets).
#
#   bench-eval.sh DRAFTER [PROMPTS]
set -uo pipefail
W=/tmp/w
export TANDEM_MODELS_DIR=$W/models
drafter=${1:?bench-eval.sh needs a drafter folder}
n=${2:-16}
for set in chat prose docs math code; do
  f=drafters/eval/$set.json
  [ "$set" = docs ] && f=drafters/gemma-3-270m-dspark/held_out_prompts.json
  modes=(g8); [[ "$set" =~ ^(chat|prose|docs)$ ]] && modes+=(adaptive)
  for mode in "${modes[@]}"; do
    extra=(); [ "$mode" = adaptive ] && extra=(--adaptive-gamma)
    "$W/tandem" bench speculative --device cuda --dtype bf16 --prompts-file "$f" \
      --prompts "$n" --max-tokens 64 --gammas 8 --repeats 1 --drafter "$drafter" \
      "${extra[@]}" --json "$OUT/h200-$set-$mode.json" 2>&1 | tail -7
  done
done
