#!/usr/bin/env python3
"""llama.cpp CPU baseline for Gemma 3 270M Q4_K_M (the number tandem has to beat).

Measures, through llama-cpp-python (0.3.16 when written) with n_threads=2:

  (a) prefill tokens/s: one ~200-token prompt evaluated with n_batch=512
      (logits for the last position only), median of 3 runs;
  (b) plain greedy decode tokens/s at batch 1: 128 new tokens after a short
      prompt, one llama_decode per token, argmax in numpy, median of 3 runs
      (wall time of the loop, argmax included);
  (c) the wall time of ONE forward over a block of B = 1, 2, 4, 8, 16 tokens
      appended at context position 256 (the shape of a speculative-decoding
      verification step), median of 5. Each repetition rolls the KV cache back
      to 256 tokens (``llama_memory_seq_rm`` of positions >= 256 before the
      decode). Two columns: logits for the last block position only, and logits for
      every block position (what verification actually needs: an extra
      262144 x 640 output projection per token).

Timings in (a) and (c) are of the llama_decode call alone (the binding's
low-level context is used directly, so no numpy copy of the logits is timed).

Prints a table and writes JSON to --out (default bench-out/llamacpp_baseline.json).

    pip install llama-cpp-python==0.3.16 numpy
    python3 scripts/bench/llamacpp_baseline.py [--gguf PATH] [--out PATH]

Run on an otherwise idle machine; the load average at start and end is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("TANDEM_MODELS_DIR", Path.home() / ".cache/tandem/models"))
DEFAULT_GGUF = MODELS / "gemma-3-270m/gemma-3-270m-q4_k_m.gguf"

PARAGRAPH = (
    "Speculative decoding speeds up autoregressive generation by letting a small "
    "draft model propose several tokens that the large target model then verifies "
    "in a single forward pass. When the draft is usually right, the target model "
    "emits more than one token per pass, and the output distribution is unchanged. "
)
BLOCKS = [1, 2, 4, 8, 16]
CTX_POS = 256


def make_prompt(llm, n_target: int) -> list[int]:
    """Deterministic prompt of exactly n_target tokens (BOS included)."""
    text = PARAGRAPH
    while len(llm.tokenize(text.encode(), add_bos=True)) < n_target:
        text += PARAGRAPH
    return llm.tokenize(text.encode(), add_bos=True)[:n_target]


def load(gguf: Path, threads: int):
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(gguf),
        n_ctx=1024,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        n_ubatch=512,
        logits_all=False,
        seed=0,
        verbose=False,
    )


def forward(llm, tokens: list[int], n_past: int, all_logits: bool = False) -> float:
    """One llama_decode of `tokens` at positions n_past.. (KV cells >= n_past dropped
    first, i.e. rolled back). Returns the wall time of the decode call alone."""
    llm._ctx.kv_cache_seq_rm(-1, n_past, -1)
    llm._batch.set_batch(batch=tokens, n_past=n_past, logits_all=all_logits)
    t = time.perf_counter()
    llm._ctx.decode(llm._batch)
    return time.perf_counter() - t


def last_logits(llm) -> np.ndarray:
    return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))


def bench_prefill(llm, ids: list[int], reps: int = 3) -> dict:
    forward(llm, ids, 0)  # warm-up
    times = [forward(llm, ids, 0) for _ in range(reps)]
    med = statistics.median(times)
    return {"n_tokens": len(ids), "times_s": times, "median_s": med, "tokens_per_s": len(ids) / med,
            "best_tokens_per_s": len(ids) / min(times)}


def bench_decode(llm, prompt: list[int], n_new: int = 128, reps: int = 3) -> dict:
    def once() -> tuple[float, list[int]]:
        forward(llm, prompt, 0)
        out = []
        pos = len(prompt)
        t = time.perf_counter()
        for _ in range(n_new):
            nxt = int(np.argmax(last_logits(llm)))
            out.append(nxt)
            forward(llm, [nxt], pos)
            pos += 1
        return time.perf_counter() - t, out

    once()  # warm-up
    runs = [once() for _ in range(reps)]
    times = [r[0] for r in runs]
    med = statistics.median(times)
    return {
        "prompt_tokens": len(prompt),
        "n_new": n_new,
        "times_s": times,
        "median_s": med,
        "tokens_per_s": n_new / med,
        "ms_per_token": 1000 * med / n_new,
        "best_tokens_per_s": n_new / min(times),
        "note": "wall time of the whole loop incl. numpy argmax over 262144 logits per token",
        "text": llm.detokenize(runs[0][1]).decode("utf-8", errors="replace"),
    }


def bench_blocks(llm, ctx: list[int], block_src: list[int], all_logits: bool, reps: int = 5) -> dict:
    forward(llm, ctx, 0)
    res = {}
    for b in BLOCKS:
        block = block_src[:b]
        # first is a warm-up; each call rolls the KV cache back to CTX_POS first
        times = [forward(llm, block, CTX_POS, all_logits) for _ in range(reps + 1)][1:]
        med = statistics.median(times)
        res[str(b)] = {"times_s": times, "median_ms": 1000 * med, "ms_per_token": 1000 * med / b,
                       "min_ms": 1000 * min(times)}
    return res


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def main() -> None:
    ap = argparse.ArgumentParser(description="llama.cpp baseline for Gemma 3 270M")
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench-out/llamacpp_baseline.json")
    args = ap.parse_args()

    import llama_cpp

    load_start = loadavg()
    llm = load(args.gguf, args.threads)
    prompt200 = make_prompt(llm, 200)
    ctx_ids = make_prompt(llm, CTX_POS + max(BLOCKS))
    ctx, block_src = ctx_ids[:CTX_POS], ctx_ids[CTX_POS:]

    prefill = bench_prefill(llm, prompt200)
    decode = bench_decode(llm, llm.tokenize(b"The capital of Germany is", add_bos=True))
    blocks_last = bench_blocks(llm, ctx, block_src, all_logits=False)
    blocks_all = bench_blocks(llm, ctx, block_src, all_logits=True)
    load_end = loadavg()

    print(f"llama-cpp-python {llama_cpp.__version__}, threads={args.threads}, model={args.gguf.name}")
    print(f"load average at start {load_start}, at end {load_end}")
    print(f"(a) prefill {prefill['n_tokens']} tokens (n_batch=512): "
          f"{prefill['tokens_per_s']:.1f} tok/s  (median {1000 * prefill['median_s']:.1f} ms; "
          f"best run {prefill['best_tokens_per_s']:.1f} tok/s)")
    print(f"(b) greedy decode {decode['n_new']} tokens, batch 1: "
          f"{decode['tokens_per_s']:.1f} tok/s  ({decode['ms_per_token']:.2f} ms/token; "
          f"best run {decode['best_tokens_per_s']:.1f} tok/s)")
    print(f"(c) one forward of a B-token block at context {CTX_POS} (median of 5):")
    print(f"    {'B':>3}  {'last-logits ms':>14}  {'ms/tok':>7}  {'(min)':>7}  {'all-logits ms':>13}  {'ms/tok':>7}  {'(min)':>7}")
    for b in BLOCKS:
        l, a = blocks_last[str(b)], blocks_all[str(b)]
        print(f"    {b:>3}  {l['median_ms']:>14.2f}  {l['ms_per_token']:>7.2f}  {l['min_ms']:>7.2f}  "
              f"{a['median_ms']:>13.2f}  {a['ms_per_token']:>7.2f}  {a['min_ms']:>7.2f}")

    doc = {
        "tool": "scripts/bench/llamacpp_baseline.py",
        "llama_cpp_python": llama_cpp.__version__,
        "model": args.gguf.name,
        "threads": args.threads,
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "prefill": prefill,
        "decode": decode,
        "block_forward_ctx": CTX_POS,
        "block_forward_last_logits": blocks_last,
        "block_forward_all_logits": blocks_all,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
