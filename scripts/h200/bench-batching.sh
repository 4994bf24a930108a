#!/usr/bin/env bash
# Continuous batching on a lent H200 or H100 (issues 36 and 39): `tandem bench load` through
# the services (a verifier and two drafters on loopback, real gRPC) on the GPU target in
# bf16, after train-broad.sh's `stage` calls have put the binary, the GGUF and the
# tokenizer under /tmp/w. Clients send the chat evaluation set's prompts, 64 tokens each,
# four requests per client one after another; plain, fixed γ = 8 and scheduled modes.
#
#   bench-batching.sh greedy|sampled [CONCURRENCY] [MODES]
#
# Writes $OUT/<card>-load-<arm>.json and .png (card: h200 or h100) and the run's log.
set -uo pipefail
W=/tmp/w
export TANDEM_MODELS_DIR=$W/models
GGUF_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
echo "$GGUF_SHA256  $W/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf" | sha256sum -c || exit 1
arm=${1:?greedy or sampled}
concurrency=${2:-1,2,4,8,16,32}
modes=${3:-plain,fixed,scheduled}
temperature=0
[ "$arm" = sampled ] && temperature=0.7
gpu=h100
nvidia-smi --query-gpu=name --format=csv,noheader | grep -qi h200 && gpu=h200
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
RUST_LOG=${RUST_LOG:-warn} "$W/tandem" bench load --device cuda --dtype bf16 \
  --concurrency "$concurrency" --modes "$modes" --requests 4 --max-tokens 64 \
  --temperature "$temperature" --prompts drafters/eval/chat.json \
  --json "$OUT/$gpu-load-$arm.json" --png "$OUT/$gpu-load-$arm.png" 2>&1 \
  | tee "$OUT/$gpu-load-$arm.log" | grep -v "^\s*$" | tail -60
nvidia-smi --query-gpu=memory.used --format=csv
