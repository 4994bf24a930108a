#!/usr/bin/env python3
"""Golden reference fixture for Gemma 3 270M (Q4_K_M GGUF), generated with llama.cpp.

What it makes
-------------
``shared/gemma/tests/fixtures/gemma3_270m_llamacpp.json``: for a fixed list of
prompts (short English, code, a list, a question, non-ASCII text, a chat-template
prompt with special tokens, a BOS-only prompt, and a ~600-token prompt whose
continuation crosses Gemma 3's 512-token sliding window) it records

* ``prompt_ids``: llama.cpp's tokenization with BOS (id 2) prepended,
* ``hf_ids_match``: whether the HF ``tokenizers`` tokenization of the same text,
  with BOS prepended, is identical (``hf_ids`` is added when it is not),
* ``generated_ids`` / ``generated_text``: 48 greedy tokens (pure argmax over the
  raw logits, computed here with numpy -- the llama.cpp sampler is not used --
  and *not* stopping at EOS),
* ``step_margins``: for each of the 48 steps, top1 - top2 logit (small margins
  mark steps where an independent implementation may legitimately pick another
  token),
* ``first_logits_top``: the top-32 ``[id, logit]`` pairs of the logits after the
  whole prompt (the distribution of the first generated token),
* ``first_logits_stats``: max / min / mean / std / argmax of that full vector.

Reference settings: ``Llama(n_ctx=1024, n_threads=2, n_batch=1, n_ubatch=1,
logits_all=True, seed=0)``. ``n_batch=1`` makes llama.cpp evaluate every token
alone (prompt tokens included), which is the most exact reference for a decoder
that runs token by token; llama.cpp is not batch invariant, so logits from a
batched prompt evaluation differ in the last bits.

How to run
----------
    pip install llama-cpp-python==0.3.16 tokenizers numpy
    python3 scripts/golden/gemma3_llamacpp.py                 # writes the fixture
    python3 scripts/golden/gemma3_llamacpp.py --batch \\
        --out bench-out/gemma3_llamacpp_batch512.json \\
        --compare shared/gemma/tests/fixtures/gemma3_270m_llamacpp.json
        # n_batch = n_ubatch = 512 (batched prompt evaluation), compared with the
        # n_batch=1 fixture: greedy-id mismatches and top-logit max abs diff.

Model / tokenizer paths default to ``$TANDEM_MODELS_DIR`` (default
``~/.cache/tandem/models``) as laid out by ``scripts/fetch-models.sh``.

Generated with llama-cpp-python 0.3.16 (llama.cpp vendored in that release), CPU
build with ``CMAKE_ARGS=-DGGML_NATIVE=ON``. Takes ~1-2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("TANDEM_MODELS_DIR", Path.home() / ".cache/tandem/models"))
DEFAULT_GGUF = MODELS / "gemma-3-270m/gemma-3-270m-q4_k_m.gguf"
DEFAULT_TOKENIZER = MODELS / "gemma-3-tokenizer/tokenizer.json"
DEFAULT_OUT = REPO / "shared/gemma/tests/fixtures/gemma3_270m_llamacpp.json"

BOS_ID = 2
N_NEW = 48
TOP_K = 32
N_CTX = 1024


def long_prompt() -> str:
    """~600 tokens, deterministic: numbered paragraphs of a fixed text."""
    para = (
        "The river starts high in the mountains, where snow melts each spring and "
        "feeds a thousand small streams. They join in the valley, turn a mill, pass "
        "under an old stone bridge and run on toward the sea."
    )
    parts = [f"{i}. {para}" for i in range(1, 14)]
    return "\n".join(parts) + "\n14."


# (name, prompt, parse_special)
PROMPTS: list[tuple[str, str, bool]] = [
    ("capital", "The capital of Germany is", False),
    ("python_def", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', False),
    ("rust_main", "fn main() {", False),
    (
        "prose",
        "The old lighthouse keeper climbed the spiral stairs every evening, carrying "
        "a lantern and a notebook in which he recorded",
        False,
    ),
    ("list", "1, 2, 3,", False),
    ("question", "Question: Why is the sky blue?\nAnswer:", False),
    ("non_ascii", "Café au lait, 東京 and naïve", False),
    (
        "chat_template",
        "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
        True,
    ),
    ("indented_code", "    for i in range(10):\n        if i % 2 == 0:\n", False),
    ("bos_only", "", False),
    ("long_sliding_window", long_prompt(), False),
]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def f32(x) -> float:
    """Shortest decimal that round-trips the float32 value."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def hf_ids(tok, prompt: str, parse_special: bool) -> list[int]:
    if tok is None:
        return []
    # add_special_tokens=False so the post-processor does not add BOS itself; we
    # prepend it explicitly. Added tokens (<start_of_turn> ...) are always matched
    # by HF tokenizers, which corresponds to llama.cpp's parse_special=True.
    enc = tok.encode(prompt, add_special_tokens=False)
    return [BOS_ID] + list(enc.ids)


def run_case(llm, name: str, prompt: str, parse_special: bool, tok) -> dict:
    ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=parse_special)
    if not ids or ids[0] != BOS_ID:
        raise SystemExit(f"{name}: expected BOS {BOS_ID} first, got {ids[:4]}")
    if ids[:2] == [BOS_ID, BOS_ID]:
        raise SystemExit(f"{name}: double BOS")
    if len(ids) + N_NEW > N_CTX:
        raise SystemExit(f"{name}: prompt too long ({len(ids)})")

    llm.reset()
    llm.eval(ids)
    first = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32, copy=True)

    generated: list[int] = []
    margins: list[float] = []
    logits = first
    for _ in range(N_NEW):
        top2 = np.argpartition(-logits, 1)[:2]
        top2 = top2[np.argsort(-logits[top2], kind="stable")]
        nxt = int(np.argmax(logits))  # first index among ties, like a plain argmax
        margins.append(round(float(logits[top2[0]] - logits[top2[1]]), 5))
        generated.append(nxt)
        llm.eval([nxt])
        logits = llm.scores[llm.n_tokens - 1]

    order = np.argsort(-first, kind="stable")[:TOP_K]
    case = {
        "name": name,
        "prompt": prompt,
        "parse_special": parse_special,
        "n_prompt_tokens": len(ids),
        "prompt_ids": [int(t) for t in ids],
        "generated_ids": generated,
        "generated_text": llm.detokenize(generated).decode("utf-8", errors="replace"),
        "step_margins": margins,
        "first_logits_top": [[int(i), f32(first[i])] for i in order],
        "first_logits_stats": {
            "n_vocab": int(first.shape[0]),
            "argmax": int(np.argmax(first)),
            "max": f32(first.max()),
            "min": f32(first.min()),
            "mean": float(np.mean(first, dtype=np.float64)),
            "std": float(np.std(first, dtype=np.float64)),
        },
    }
    h = hf_ids(tok, prompt, parse_special)
    if tok is not None:
        case["hf_ids_match"] = h == case["prompt_ids"]
        if not case["hf_ids_match"]:
            case["hf_ids"] = h
    return case


def compare(ref_path: Path, cases: list[dict]) -> None:
    ref = {c["name"]: c for c in json.loads(ref_path.read_text())["cases"]}
    worst = 0.0
    print(f"\ncomparison against {ref_path}:")
    for c in cases:
        r = ref.get(c["name"])
        if r is None:
            print(f"  {c['name']:22s} not in reference")
            continue
        same_prompt = r["prompt_ids"] == c["prompt_ids"]
        g1, g2 = r["generated_ids"], c["generated_ids"]
        first_diff = next((i for i, (a, b) in enumerate(zip(g1, g2)) if a != b), None)
        rtop = dict((i, v) for i, v in r["first_logits_top"])
        ctop = dict((i, v) for i, v in c["first_logits_top"])
        common = set(rtop) & set(ctop)
        d = max(abs(rtop[i] - ctop[i]) for i in common) if common else float("nan")
        worst = max(worst, d)
        top_same = [i for i, _ in r["first_logits_top"]] == [i for i, _ in c["first_logits_top"]]
        print(
            f"  {c['name']:22s} prompt_ids_same={same_prompt} greedy_same={first_diff is None}"
            + ("" if first_diff is None else f" (first diff at step {first_diff})")
            + f" top32_order_same={top_same} max_abs_diff_top_logits={d:.6g}"
        )
    print(f"  overall max abs diff of first-position top-{TOP_K} logits: {worst:.6g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--batch", action="store_true", help="n_batch = n_ubatch = 512 instead of 1")
    ap.add_argument("--compare", type=Path, default=None, help="reference fixture to diff against")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import llama_cpp

    n_batch = 512 if args.batch else 1
    out = args.out or (DEFAULT_OUT if not args.batch else REPO / "bench-out/gemma3_llamacpp_batch512.json")

    tok = None
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(args.tokenizer))
    except Exception as e:  # noqa: BLE001 - the fixture is still useful without it
        print(f"warning: HF tokenizer not available ({e}); hf_ids_match omitted", file=sys.stderr)

    llm = llama_cpp.Llama(
        model_path=str(args.gguf),
        n_ctx=N_CTX,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=n_batch,
        n_ubatch=n_batch,
        logits_all=True,
        seed=0,
        verbose=False,
    )
    assert llm.token_bos() == BOS_ID, llm.token_bos()

    cases = []
    t0 = time.time()
    for name, prompt, special in PROMPTS:
        c = run_case(llm, name, prompt, special, tok)
        cases.append(c)
        print(
            f"{name:22s} n_prompt={c['n_prompt_tokens']:4d} hf_match={c.get('hf_ids_match')} "
            f"gen[:8]={c['generated_ids'][:8]} text={c['generated_text'][:60]!r}",
            flush=True,
        )
    print(f"done in {time.time() - t0:.1f}s")

    doc = {
        "generator": {
            "script": "scripts/golden/gemma3_llamacpp.py",
            "llama_cpp_python": llama_cpp.__version__,
            "model": args.gguf.name,
            "model_sha256": sha256_file(args.gguf),
            "tokenizer_sha256": sha256_file(args.tokenizer) if args.tokenizer.exists() else None,
            "n_ctx": N_CTX,
            "n_batch": n_batch,
            "n_ubatch": n_batch,
            "n_threads": args.threads,
            "bos_id": BOS_ID,
            "n_new_tokens": N_NEW,
            "decoding": "greedy: numpy argmax of raw logits (first index on ties), EOS not special-cased",
            "top_k_recorded": TOP_K,
        },
        "cases": cases,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    # one case per line: small and still diff-friendly
    text = text.replace(',"cases":[{', ',"cases":[\n{').replace('},{"name"', '},\n{"name"')
    out.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")

    if args.compare:
        compare(args.compare, cases)


if __name__ == "__main__":
    main()
