#!/usr/bin/env bash
# Continuous batching on a lent H200 or H100 (issues 36 and 39): `tandem bench load` through
# the services (a verifier and two drafters on loopback, real gRPC) on the GPU target in
# bf16, after train-broad.sh's `stage` calls have put the binary, the GGUF and the
# tokenizer under /tmp/w. Clients send the chat evaluation set's prompts, 64 tokens each,
# four requests per client one after another. Three runs:
#   greedy      plain, fixed γ = 8 and scheduled, batched
#   sampled     the same at T = 0.7
#   unbatched   greedy plain and fixed γ = 8 with --batching false (each generation runs
#               its own forwards, as before batching on the GPU): the baseline
#
#   bench-batching.sh [CONCURRENCY] [RUNS]      (defaults 1,2,4,8,16,32 and all three)
#
# The reports (JSON, PNG, log per run) come back as $OUT/<card>-load.tar.xz (a call
# returns at most 8 files).
set -uo pipefail
W=/tmp/w
export TANDEM_MODELS_DIR=$W/models
GGUF_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
echo "$GGUF_SHA256  $W/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf" | sha256sum -c || exit 1
concurrency=${1:-1,2,4,8,16,32}
runs=${2:-greedy sampled unbatched}
gpu=h100
nvidia-smi --query-gpu=name --format=csv,noheader | grep -qi h200 && gpu=h200
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
for run in $runs; do
  flags=(--modes plain,fixed,scheduled --temperature 0)
  case $run in
    sampled) flags=(--modes plain,fixed,scheduled --temperature 0.7) ;;
    unbatched) flags=(--modes plain,fixed --temperature 0 --batching false) ;;
  esac
  echo "== $run"
  RUST_LOG=${RUST_LOG:-warn} "$W/tandem" bench load --device cuda --dtype bf16 \
    --concurrency "$concurrency" --requests 4 --max-tokens 64 "${flags[@]}" \
    --prompts drafters/eval/chat.json \
    --json "$OUT/$gpu-load-$run.json" --png "$OUT/$gpu-load-$run.png" \
    > "$OUT/$gpu-load-$run.log" 2>&1
  grep -v "^\s*$" "$OUT/$gpu-load-$run.log" | tail -30
done
nvidia-smi --query-gpu=memory.used --format=csv
(cd "$OUT" && tar -cJf "$gpu-load.tar.xz" ./*-load-* && rm ./*-load-*.json ./*-load-*.png ./*-load-*.log)
ls -l "$OUT"
