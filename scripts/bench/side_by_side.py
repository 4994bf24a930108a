#!/usr/bin/env python3
"""tandem against llama.cpp on the same GGUF, in alternating rounds.

This shared VM's speed drifts by tens of percent within minutes, so two numbers
measured a minute apart say little about each other. Each round here runs, back
to back, llama.cpp's greedy decode (128 tokens) and its 8-token all-logits block
forward (llama-cpp-python, 2 threads, the functions of llamacpp_baseline.py), then
`tandem bench target` (decode 128 tokens, block forwards of 1 and 9 tokens at
context 256), and reports each round's ratios; the summary is the median over rounds.

    python3 scripts/bench/side_by_side.py [--rounds 5] [--tandem target/release/tandem]
        [--precision exact] [--out bench-out/side_by_side.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_baseline as lb  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def llama_round(llm, prompt: list[int], ctx: list[int], block_src: list[int]) -> dict:
    decode = lb.bench_decode(llm, prompt, n_new=128, reps=1)
    lb.forward(llm, ctx, 0)
    times = [lb.forward(llm, block_src[:8], lb.CTX_POS, True) for _ in range(6)][1:]
    block8 = 1000 * statistics.median(times)
    step = decode["ms_per_token"]
    return {"decode_tok_s": decode["tokens_per_s"], "block8_ms": block8, "block8_steps": block8 / step}


def tandem_round(binary: Path, precision: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(
            [str(binary), "bench", "target", "--blocks", "1,9", "--repeats", "1",
             "--decode-tokens", "128", "--precision", precision, "--json", f.name],
            check=True, stdout=subprocess.DEVNULL,
        )
        r = json.loads(Path(f.name).read_text())
    block9 = next(b for b in r["blocks"] if b["block"] == 9)
    return {"decode_tok_s": r["decode_tok_s"], "block9_ms": block9["ms"],
            "block9_steps": block9["decode_steps"],
            "block9_greedy_steps": block9["greedy_decode_steps"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gguf", type=Path, default=lb.DEFAULT_GGUF)
    ap.add_argument("--tandem", type=Path, default=REPO / "target/release/tandem")
    ap.add_argument("--precision", default="exact")
    ap.add_argument("--out", type=Path, default=REPO / "bench-out/side_by_side.json")
    args = ap.parse_args()

    llm = lb.load(args.gguf, 2)
    prompt = lb.make_prompt(llm, 16)
    long = lb.make_prompt(llm, lb.CTX_POS + 16)
    ctx, block_src = long[: lb.CTX_POS], long[lb.CTX_POS:]
    rounds = []
    print(f"{'round':>5} {'llama tok/s':>11} {'tandem tok/s':>12} {'ratio':>6} "
          f"{'llama 8-block steps':>19} {'tandem 9-block steps':>20} {'greedy':>6}")
    for i in range(args.rounds):
        ll = llama_round(llm, prompt, ctx, block_src)
        td = tandem_round(args.tandem, args.precision)
        ratio = td["decode_tok_s"] / ll["decode_tok_s"]
        rounds.append({"llama_cpp": ll, "tandem": td, "decode_ratio": ratio})
        print(f"{i + 1:>5} {ll['decode_tok_s']:>11.1f} {td['decode_tok_s']:>12.1f} {ratio:>6.2f} "
              f"{ll['block8_steps']:>19.2f} {td['block9_steps']:>20.2f} "
              f"{td['block9_greedy_steps']:>6.2f}")
    med = lambda xs: statistics.median(xs)  # noqa: E731
    summary = {
        "decode_ratio": med([r["decode_ratio"] for r in rounds]),
        "tandem_decode_tok_s": med([r["tandem"]["decode_tok_s"] for r in rounds]),
        "llama_decode_tok_s": med([r["llama_cpp"]["decode_tok_s"] for r in rounds]),
        "tandem_block9_steps": med([r["tandem"]["block9_steps"] for r in rounds]),
        "tandem_block9_greedy_steps": med([r["tandem"]["block9_greedy_steps"] for r in rounds]),
        "llama_block8_steps": med([r["llama_cpp"]["block8_steps"] for r in rounds]),
    }
    print("median: " + ", ".join(f"{k} {v:.2f}" for k, v in summary.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"tool": "scripts/bench/side_by_side.py", "precision": args.precision,
           "model": args.gguf.name, "rounds": rounds, "median": summary}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
