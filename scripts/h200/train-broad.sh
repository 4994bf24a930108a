#!/usr/bin/env bash
# The broad-corpus drafter run of issue 33 on the lent H200, as device commands (each at
# most ten minutes; the machine keeps /tmp while calls follow each other). Files travel in
# folders under .dev/ (ignored by git), one carried per call: tandem-cuda.xz
# (scripts/build-cuda.sh), tokenizer.json.xz, corpus.tar.xz (scripts/fetch-corpus.sh's
# train/ folder), shipped.tar (the drafter to start from, a folder gemma-3-270m-dspark; without
# it the repository's shipped one; too large for one call, it may come in parts
# shipped.tar.partNN), the GGUF in parts gguf.partNN and, to go on with a run of an
# earlier session, its checkpoint in parts state.tar.partNN (made by `pack`).
#
#   train-broad.sh stage DIR    unpack what DIR holds into /tmp/w (parts are appended)
#   train-broad.sh start        check the GGUF, then in the background: run A (the shipped
#                               drafter moved to this corpus's draft vocabulary and trained
#                               on; GROW_LAYERS / GROW_FF_MULT grow it first to that many
#                               layers / that feed-forward multiple), which makes every
#                               sample first and, where it fails (a batch's peak can run
#                               the GPU out of memory), resumes from its last checkpoint
#                               (every 100 steps) up to 8 times; with SHAPE_RUN=1, once
#                               they are stored, run B (a wider, deeper drafter from scratch)
#                               beside it (each then trains at about half the pace).
#                               With a staged checkpoint, run A resumes it instead (the
#                               same settings and STEPS as it started with; its samples
#                               are made again, from the same seed)
#   train-broad.sh wait SECS    wait up to SECS while the runs go on; print their logs' ends
#                               (and, once they have ended, collect)
#                               A lent machine is given back once no call has run on it for
#                               its idle time (30 s), background runs and all: start in the
#                               same call as a wait (`start && wait $((570 - SECONDS))`) and
#                               follow with wait calls until the runs end
#   train-broad.sh collect      copy the drafters and logs to $OUT
#   train-broad.sh pack         stop the runs; run A's last checkpoint (drafter, optimizer
#                               moments, step) as /tmp/w/state/state.tar.partNN of 15 MiB
#   train-broad.sh collect-state N
#                               copy parts 4N..4N+3 to $OUT (four fit what one call brings
#                               back; stage them again two to a folder)
set -euo pipefail
W=/tmp/w
GGUF_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
export TANDEM_MODELS_DIR=$W/models
STEPS=${STEPS:-3000}
GROW="${GROW_LAYERS:+--grow-layers $GROW_LAYERS} ${GROW_FF_MULT:+--grow-ff-mult $GROW_FF_MULT}"
# REBUILD_VOCAB=0 keeps the starting drafter's draft vocabulary; TRAIN_ONLY=bb.2.,bb.3.
# steps only those parameters (a grown drafter's new layers), the rest stay as they start.
# CORPUS_WEIGHTS="docs=4 prose=0.5" takes that many times the prompts per file from those
# folders of the corpus; LR sets the peak learning rate (1.5e-3); PROMPT_TOKENS the prompt
# length (64; a longer one keeps whole requests that carry a passage); TV_TEMPERATURE the
# temperature of the loss's total variation (1; 0.7 fits what clients sampling at 0.7 accept).
REVOCAB=$([ "${REBUILD_VOCAB:-1}" = 1 ] && echo --rebuild-vocab || true)
WEIGHTS=$(for w in ${CORPUS_WEIGHTS:-}; do printf -- "--corpus-weight %s/corpus/train/%s " "$W" "$w"; done)

data_flags() {
  echo --corpus "$W/corpus/train" --prompt-tokens "${PROMPT_TOKENS:-64}" --continuation-tokens 64 \
    --train-prompts "${PROMPTS:-24000}" --held-out-prompts 64 --held-out-percent 5 \
    --keep 64 --temperatures 0,0.7,1 --teacher-batch 512 --samples-cache "$W/cache" \
    --pregenerate --vocab-samples 4096 --seed 4 \
    --samples-per-step 32 --batch 1024 --warmup 50 --eval-every 250 --checkpoint-every 100 \
    --device cuda ${TRAIN_ONLY:+--train-only $TRAIN_ONLY} \
    ${TV_TEMPERATURE:+--tv-temperature $TV_TEMPERATURE} $WEIGHTS
}

# The drafters and logs of the runs, copied to $OUT.
collect() {
  for r in a b; do
    [ -d "$W/$r" ] || continue
    mkdir -p "$OUT/$r"
    cp "$W/$r.log" "$OUT/$r/" 2>/dev/null || true
    cp "$W/$r"/dspark.json "$W/$r"/model*.safetensors* "$OUT/$r/" 2>/dev/null || true
  done
  ls -lR "$OUT"
}

case "${1:-}" in
stage)
  mkdir -p "$W/models/gemma-3-270m" "$W/models/gemma-3-tokenizer"
  for f in "${2:?stage needs a folder}"/*; do
    case "$f" in
      *gguf.part*) cat "$f" >> "$W/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf" ;;
      *tandem-cuda.xz) xz -dc "$f" > "$W/tandem" && chmod +x "$W/tandem" ;;
      *tokenizer.json.xz) xz -dc "$f" > "$W/models/gemma-3-tokenizer/tokenizer.json" ;;
      *corpus.tar.xz) mkdir -p "$W/corpus" && tar -xJf "$f" -C "$W/corpus" ;;
      *shipped.tar.part*) cat "$f" >> "$W/shipped.tar.parts" ;;
      *state.tar.part*) cat "$f" >> "$W/state.tar.parts" ;;
      *shipped.tar) cp "$f" "$W/shipped.tar" ;;
    esac
  done
  ls -l "$W" "$W/models/gemma-3-270m"
  ;;
start)
  [ -f "$W/shipped.tar.parts" ] && mv "$W/shipped.tar.parts" "$W/shipped.tar"
  if [ -f "$W/shipped.tar" ]; then
    rm -rf "$W/shipped" && tar -xf "$W/shipped.tar" -C "$W" && mv "$W/gemma-3-270m-dspark" "$W/shipped"
  fi
  [ -d "$W/shipped" ] || cp -r drafters/gemma-3-270m-dspark "$W/shipped"
  sha256sum "$W/shipped"/*.safetensors
  rm -f "$W/stop"
  if [ -f "$W/state.tar.parts" ]; then
    rm -rf "$W/a" && tar -xf "$W/state.tar.parts" -C "$W" && rm "$W/state.tar.parts"
  fi
  first="--init-from $W/shipped $REVOCAB $GROW"
  [ -f "$W/a/trainer.json" ] && first=--resume && cat "$W/a/trainer.json"
  echo "$GGUF_SHA256  $W/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf" | sha256sum -c
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
  cd "$W"
  run_a="./tandem train-drafter $(data_flags) --out $W/a --steps $STEPS --lr ${LR:-1.5e-3}"
  setsid nohup bash -c "
    : > $W/a.log
    ($run_a $first || for i in 1 2 3 4 5 6 7 8; do
        [ -f $W/a/trainer.json ] && [ ! -f $W/stop ] || break
        echo \"[run A failed; resuming from its last checkpoint, try \$i]\"
        $run_a --resume && break
      done) >> $W/a.log 2>&1 &
    [ \"${SHAPE_RUN:-0}\" = 1 ] || exit 0
    until grep -q 'draft vocabulary of' $W/a.log 2>/dev/null; do sleep 5; done
    ./tandem train-drafter $(data_flags) --out $W/b --d-draft 384 --layers 3 --heads 6 \
      --markov-rank 64 --draft-vocab-size 32768 --steps $STEPS --lr 2e-3 > $W/b.log 2>&1 &
    wait" > "$W/runs.log" 2>&1 < /dev/null &
  sleep 20; tail -5 "$W/a.log"
  ;;
wait)
  end=$((SECONDS + ${2:-500}))
  while [ $SECONDS -lt $end ] && pgrep -f "tandem train-drafter" > /dev/null; do sleep 10; done
  for r in a b; do [ -f "$W/$r.log" ] || continue; echo "== $r"; grep -E "eval|samples|vocabulary|error|Error" "$W/$r.log" | tail -8; tail -2 "$W/$r.log"; done
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
  # Once the runs have ended, their drafters come back with this call: a machine released
  # before a `collect` (idle for its release time) takes them with it.
  pgrep -f "tandem train-drafter" > /dev/null || collect
  ;;
collect) collect ;;
pack)
  touch "$W/stop"
  pkill -f "tandem train-drafter" || true
  while pgrep -f "tandem train-drafter" > /dev/null; do sleep 1; done
  rm -rf "$W/state" && mkdir -p "$W/state"
  tar -cf - -C "$W" a | split -b 15M -d - "$W/state/state.tar.part"
  cat "$W/a/trainer.json"; ls -l "$W/state"
  ;;
collect-state)
  n=${2:?collect-state needs a number}
  for i in 0 1 2 3; do
    f=$(printf "%s/state/state.tar.part%02d" "$W" $((4 * n + i)))
    [ -f "$f" ] && cp "$f" "$OUT/"
  done
  ls -l "$OUT"
  ;;
*) echo "usage: $0 stage DIR|start|wait SECS|collect|pack|collect-state N" >&2; exit 2 ;;
esac
