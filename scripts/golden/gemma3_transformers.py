#!/usr/bin/env python3
"""Golden reference for Gemma 3 270M from transformers, on the GGUF weights dequantized.

What it makes
-------------
``shared/gemma/tests/fixtures/gemma3_270m_transformers.json``: for the prompts of the
llama.cpp fixture (same prompt ids, so both references see identical inputs) it runs
transformers' ``Gemma3ForCausalLM`` in float32 with eager attention and records

* ``generated_ids``: 48 greedy tokens (argmax of the logits, first index on ties, EOS not
  special-cased),
* ``step_margins``: top-1 minus top-2 logit at each step,
* ``first_logits_top``: the top-32 ``[id, logit]`` pairs after the whole prompt.

The weights are dequantized here with the ``gguf`` Python package (llama.cpp's reader), renamed
to the HF layout, and the GGUF norm weights (stored as ``1 + w``) are shifted back to ``w``.
Nothing of tandem's Rust code is involved.

How to run
----------
    python3 -m venv venv-ref && venv-ref/bin/pip install torch transformers gguf numpy
    venv-ref/bin/python scripts/golden/gemma3_transformers.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from gguf import GGUFReader
from gguf.quants import dequantize

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("TANDEM_MODELS_DIR", Path.home() / ".cache/tandem/models"))
GGUF = MODELS / "gemma-3-270m" / "gemma-3-270m-q4_k_m.gguf"
PROMPTS = REPO / "shared/gemma/tests/fixtures/gemma3_270m_llamacpp.json"
OUT = REPO / "shared/gemma/tests/fixtures/gemma3_270m_transformers.json"
N_NEW = 48
TOP = 32

LEAVES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    _, idx, leaf, _ = gguf_name.split(".")
    return f"model.layers.{idx}.{LEAVES[leaf]}.weight"


def load_state_dict(reader: GGUFReader) -> dict[str, torch.Tensor]:
    state = {}
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        name = hf_name(t.name)
        if "norm" in t.name:
            w = w - 1.0
        state[name] = torch.from_numpy(np.ascontiguousarray(w))
    return state


def config(reader: GGUFReader) -> transformers.Gemma3TextConfig:
    def field(key):
        return reader.fields[f"gemma3.{key}"].contents()

    return transformers.Gemma3TextConfig(
        vocab_size=262144,
        hidden_size=field("embedding_length"),
        intermediate_size=field("feed_forward_length"),
        num_hidden_layers=field("block_count"),
        num_attention_heads=field("attention.head_count"),
        num_key_value_heads=field("attention.head_count_kv"),
        head_dim=field("attention.key_length"),
        query_pre_attn_scalar=field("attention.key_length"),
        rms_norm_eps=1e-6,
        rope_theta=field("rope.freq_base"),
        rope_local_base_freq=10000.0,
        sliding_window=field("attention.sliding_window"),
        max_position_embeddings=32768,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh",
        attn_implementation="eager",
        torch_dtype="float32",
    )


@torch.no_grad()
def run_case(model, prompt_ids: list[int]) -> dict:
    ids = torch.tensor([prompt_ids])
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    logits = out.logits[0, -1].float().numpy()
    order = np.argsort(-logits, kind="stable")[:TOP]
    first_top = [[int(i), float(logits[i])] for i in order]
    generated, margins = [], []
    for _ in range(N_NEW):
        top2 = np.argsort(-logits, kind="stable")[:2]
        nxt = int(np.argmax(logits))
        generated.append(nxt)
        margins.append(float(logits[top2[0]] - logits[top2[1]]))
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float().numpy()
    return {"generated_ids": generated, "step_margins": margins, "first_logits_top": first_top}


def main() -> None:
    torch.set_num_threads(2)
    reader = GGUFReader(str(GGUF))
    model = transformers.Gemma3ForCausalLM(config(reader)).eval()
    missing, unexpected = model.load_state_dict(load_state_dict(reader), strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        sys.exit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    cases = []
    for case in json.loads(PROMPTS.read_text())["cases"]:
        res = run_case(model, case["prompt_ids"])
        cases.append({"name": case["name"], "prompt_ids": case["prompt_ids"], **res})
        print(case["name"], res["generated_ids"][:8], f"min margin {min(res['step_margins']):.4f}")
    OUT.write_text(json.dumps({
        "generator": {
            "script": "scripts/golden/gemma3_transformers.py",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "dtype": "float32",
            "attn_implementation": "eager",
            "weights": "gemma-3-270m-q4_k_m.gguf dequantized with the gguf package",
            "n_new_tokens": N_NEW,
        },
        "cases": cases,
    }, indent=1))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
