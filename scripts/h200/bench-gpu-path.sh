#!/usr/bin/env bash
# Issue 39 on a lent H200 or H100: the target's steps replayed as CUDA graphs against
# launched op by op (`--cuda-graphs true|false`), bf16, batch 1, after train-broad.sh's
# `stage` calls have put the binary, the GGUF and the tokenizer under /tmp/w. Writes to
# $OUT, each name starting with the card (h200 or h100):
#   GPU-target-graphs-{true,false}.json  bench target: plain decode, block forwards 1-16
#   GPU-spec-graphs-{true,false}.json    bench speculative on the docs set, γ = 8, with
#                                        greedy outputs checked against plain decoding
#   GPU-golden-graphs-{true,false}.json  bench golden: greedy ids, plain and speculative,
#                                        against transformers up to each near-tie
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
for g in true false; do
  "$W/tandem" bench target --device cuda --dtype bf16 --cuda-graphs $g \
    --blocks 1,2,4,8,9,12,16 --decode-tokens 128 --repeats 3 \
    --json "$OUT/$gpu-target-graphs-$g.json" 2>&1 | grep -v "^\s*$"
done
for g in true false; do
  "$W/tandem" bench speculative --device cuda --dtype bf16 --cuda-graphs $g \
    --prompts-file "$docs" --prompts "$n" --max-tokens 48 --gammas 8 --repeats 2 \
    --json "$OUT/$gpu-spec-graphs-$g.json" 2>&1 | grep -v "^\s*$"
done
for g in true false; do
  "$W/tandem" bench golden --device cuda --dtype bf16 --cuda-graphs $g \
    --json "$OUT/$gpu-golden-graphs-$g.json" 2>&1 | grep -v "^\s*$"
done
nvidia-smi --query-gpu=memory.used --format=csv
