#!/usr/bin/env bash
# Issue 39 on a lent H200 or H100: the GPU path's figures, bf16, batch 1, after
# train-broad.sh's `stage` calls have put the binary, the GGUF and the tokenizer under /tmp/w.
# Writes to $OUT, each name starting with the card (h200 or h100):
#   GPU-target-graphs.json, GPU-target-op-by-op.json
#                         bench target: plain decode, block forwards (steps replayed as CUDA
#                         graphs, or launched op by op)
#   GPU-spec-docs-{fixed,adaptive,services}.json
#                         bench speculative on the docs set, γ = 8 (adaptive γ; through the
#                         services), greedy outputs checked against plain decoding
#   GPU-spec-{chat,prose}-{fixed,adaptive}.json
#                         the same on the general evaluation sets
#   GPU-golden-{bf16,f32}.json
#                         bench golden: greedy ids, plain and speculative, against
#                         transformers up to each near-tie
#
# The reports come back packed in $OUT/<card>-gpu-path.tar.xz (a call returns at most 8 files).
#
#   bench-gpu-path.sh [PROMPTS]
set -uo pipefail
W=/tmp/w
export TANDEM_MODELS_DIR=$W/models
GGUF_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
echo "$GGUF_SHA256  $W/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf" | sha256sum -c || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv
n=${1:-8}
gpu=h100
nvidia-smi --query-gpu=name --format=csv,noheader | grep -qi h200 && gpu=h200
docs=drafters/gemma-3-270m-dspark/held_out_prompts.json
run() { "$W/tandem" "$@" 2>&1 | grep -v "^\s*$"; }
run bench target --device cuda --dtype bf16 --blocks 1,2,4,8,9,12,16 --decode-tokens 128 \
  --repeats 3 --json "$OUT/$gpu-target-graphs.json"
run bench target --device cuda --dtype bf16 --cuda-graphs false --blocks 1,9,16 \
  --decode-tokens 64 --repeats 3 --json "$OUT/$gpu-target-op-by-op.json"
for arm in fixed adaptive services; do
  flags=(--repeats 3)
  [ $arm = adaptive ] && flags+=(--adaptive-gamma)
  [ $arm = services ] && flags=(--repeats 2 --services)
  run bench speculative --device cuda --dtype bf16 --prompts-file "$docs" --prompts "$n" \
    --max-tokens 48 --gammas 8 "${flags[@]}" --json "$OUT/$gpu-spec-docs-$arm.json"
done
for set in chat prose; do
  for arm in fixed adaptive; do
    flags=()
    [ $arm = adaptive ] && flags+=(--adaptive-gamma)
    run bench speculative --device cuda --dtype bf16 --prompts-file "drafters/eval/$set.json" \
      --prompts 16 --max-tokens 64 --gammas 8 --repeats 1 "${flags[@]}" \
      --json "$OUT/$gpu-spec-$set-$arm.json"
  done
done
for dtype in bf16 f32; do
  run bench golden --device cuda --dtype $dtype --json "$OUT/$gpu-golden-$dtype.json"
done
nvidia-smi --query-gpu=memory.used --format=csv
# A call brings back at most 8 files: the reports travel as one archive.
(cd "$OUT" && tar -cJf "$gpu-gpu-path.tar.xz" ./*.json && rm ./*.json)
ls -l "$OUT"
