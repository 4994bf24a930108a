#!/usr/bin/env python3
"""Golden reference for Gemma 4 text and the Gemma 4 assistant drafter, from transformers.

What it makes
-------------
Under ``shared/gemma/tests/fixtures/gemma4/``:

* ``target_ple/``: a tiny random ``Gemma4ForCausalLM`` (HF layout: ``config.json`` +
  ``model.safetensors``): 6 layers ``S S F S S F`` with their own head dims (16 sliding,
  32 full), per-layer embeddings, KV sharing of the last 2 layers (donors: layer 3 sliding,
  layer 2 full), proportional partial RoPE (0.25) on full layers, sliding window 4, final
  logit softcapping 5, random norms and layer scalars.
* ``target_keqv/``: the same shape with ``attention_k_eq_v`` (full layers: one global K/V
  head, values = keys' projection) and without per-layer embeddings.
* ``assistant_centroids/``: a tiny ``Gemma4AssistantForCausalLM`` for ``target_ple`` with the
  centroid head (16 centroids of 16 tokens, top-4), ``assistant_dense/`` with the tied dense
  head, and ``assistant_tie/``: ``assistant_centroids`` with one embedding row copied so that
  the first drafted token ties with a lower id (ties go to the lowest id).
* ``golden.json``: for each target and a 12-token prompt, all logits of all positions, the
  final-norm hidden state of every position and 8 greedy ids (full recompute each step,
  argmax = first index on ties) with their top-1/top-2 margins; for each assistant, drafts of
  6 steps from two anchors (positions 11 and 6 of the prompt, donor K/V and last hidden from
  the target forward over the prompt): tokens, the winning logit and the post-projected
  hidden state of every step.

All in float32, eager attention, on CPU. Nothing of tandem's Rust code is involved.

How to run
----------
    python3 -m venv venv-ref && venv-ref/bin/pip install torch transformers
    venv-ref/bin/python scripts/golden/gemma4_transformers.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import transformers
from transformers import (
    Gemma4AssistantConfig,
    Gemma4AssistantForCausalLM,
    Gemma4ForCausalLM,
    Gemma4TextConfig,
)

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "shared/gemma/tests/fixtures/gemma4"
PROMPT = [2, 17, 200, 45, 99, 3, 128, 77, 250, 5, 61, 143]
N_GREEDY = 8
N_DRAFT = 6
ANCHORS = [11, 6]
LAYER_TYPES = ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"]


def target_config(ple: bool, k_eq_v: bool) -> Gemma4TextConfig:
    return Gemma4TextConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=6,
        num_attention_heads=4 if k_eq_v else 2,
        num_key_value_heads=2 if k_eq_v else 1,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=k_eq_v,
        layer_types=LAYER_TYPES,
        sliding_window=4,
        final_logit_softcapping=5.0,
        vocab_size_per_layer_input=256 if ple else 0,
        hidden_size_per_layer_input=8 if ple else 0,
        num_kv_shared_layers=2,
        max_position_embeddings=256,
        attn_implementation="eager",
    )


def assistant_config(centroids: bool) -> Gemma4AssistantConfig:
    text = Gemma4TextConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=32,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        max_position_embeddings=256,
    )
    return Gemma4AssistantConfig(
        text_config=text,
        backbone_hidden_size=64,
        use_ordered_embeddings=centroids,
        num_centroids=16,
        centroid_intermediate_top_k=4,
        attn_implementation="eager",
    )


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights far from the default init, so norms, scalars and logits all matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
            elif name.endswith("token_ordering"):
                b.copy_(torch.randperm(b.numel(), generator=gen))


def top2_margin(logits: torch.Tensor) -> float:
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def run_target(model: Gemma4ForCausalLM) -> tuple[dict, object]:
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, return_shared_kv_states=True, use_cache=False)
        seq, greedy, margins = list(PROMPT), [], []
        for _ in range(N_GREEDY):
            # output_hidden_states keeps transformers 5.24 off a KV-sharing shortcut that
            # fails without per-layer embeddings.
            step = model(torch.tensor([seq]), use_cache=False, output_hidden_states=True)
            logits = step.logits[0, -1]
            nxt = int(torch.argmax(logits))
            greedy.append(nxt)
            margins.append(top2_margin(logits))
            seq.append(nxt)
    assert min(margins) > 1e-3, f"near-tie in the greedy reference: {margins}"
    record = {
        "prompt_ids": PROMPT,
        "logits": out.logits[0].tolist(),
        "last_hidden": out.hidden_states[-1][0].tolist(),
        "greedy_ids": greedy,
        "greedy_margins": margins,
    }
    return record, out


def draft(assistant, target, out, anchor: int) -> dict:
    """transformers' SinglePositionMultiTokenCandidateGenerator loop, on a prefix."""
    n = anchor + 1
    kv = {k: (v[0][:, :, :n], v[1][:, :, :n]) for k, v in out.shared_kv_states.items()}
    hidden = out.hidden_states[-1][:, anchor : anchor + 1]
    token = torch.tensor([[PROMPT[anchor]]])
    position = torch.tensor([[anchor]])
    tokens, winners, hiddens = [], [], []
    with torch.no_grad():
        for _ in range(N_DRAFT):
            emb = target.get_input_embeddings()(token)
            res = assistant(
                inputs_embeds=torch.cat([emb, hidden], dim=-1),
                attention_mask=torch.ones(1, n, dtype=torch.long),
                position_ids=position,
                shared_kv_states=kv,
                use_cache=False,
            )
            logits = res.logits[0, -1]
            token = logits.argmax(dim=-1).view(1, 1)
            hidden = res.last_hidden_state
            tokens.append(int(token))
            winners.append(float(logits.max()))
            hiddens.append(hidden[0, 0].tolist())
    return {"anchor": anchor, "tokens": tokens, "winning_logits": winners, "next_hidden": hiddens}


def candidates(assistant, target, out) -> tuple[list[int], torch.Tensor]:
    """Token ids the centroid head scores at the first step from the last anchor."""
    anchor = ANCHORS[0]
    emb = target.get_input_embeddings()(torch.tensor([[PROMPT[anchor]]]))
    hidden = out.hidden_states[-1][:, anchor : anchor + 1]
    captured = {}
    head = assistant.masked_embedding
    hook = head.register_forward_hook(lambda m, args, res: captured.setdefault("h", args[0]))
    with torch.no_grad():
        assistant(
            inputs_embeds=torch.cat([emb, hidden], dim=-1),
            position_ids=torch.tensor([[anchor]]),
            shared_kv_states=out.shared_kv_states,
            use_cache=False,
        )
    hook.remove()
    h = captured["h"][0, 0]
    top = torch.topk(head.centroids(h), head.centroid_intermediate_top_k).indices
    groups = head.token_ordering.view(head.num_centroids, -1)
    return sorted(int(t) for t in groups[top].reshape(-1)), h


def make_tie(assistant, target, out) -> tuple[int, int]:
    """Copies the first drafted token's head row to the lowest other candidate id below it."""
    first = draft(assistant, target, out, ANCHORS[0])["tokens"][0]
    ids, _ = candidates(assistant, target, out)
    lower = [t for t in ids if t < first]
    assert lower, "the first drafted token is the lowest candidate; pick another seed"
    with torch.no_grad():
        emb = assistant.model.embed_tokens.weight
        emb[lower[0]] = emb[first]
    _, h = candidates(assistant, target, out)
    scores = emb[[lower[0], first]] @ h
    assert scores[0] == scores[1], f"not an exact tie: {scores}"
    return first, lower[0]


def save(model, name: str) -> Path:
    path = OUT / name
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path)
    (path / "generation_config.json").unlink(missing_ok=True)
    return path


def main() -> None:
    torch.set_num_threads(2)
    OUT.mkdir(parents=True, exist_ok=True)
    golden = {
        "generator": {
            "script": "scripts/golden/gemma4_transformers.py",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "dtype": "float32",
        },
        "targets": {},
        "assistants": {},
    }
    outputs = {}
    for seed, (name, ple, k_eq_v) in enumerate([("target_ple", True, False), ("target_keqv", False, True)]):
        model = Gemma4ForCausalLM(target_config(ple, k_eq_v)).eval()
        randomize(model, seed)
        save(model, name)
        golden["targets"][name], out = run_target(model)
        outputs[name] = (model, out)
    target, out = outputs["target_ple"]
    for seed, (name, centroids) in enumerate([("assistant_centroids", True), ("assistant_dense", False)]):
        assistant = Gemma4AssistantForCausalLM(assistant_config(centroids)).eval()
        randomize(assistant, 10 + seed)
        save(assistant, name)
        golden["assistants"][name] = {"target": "target_ple", "drafts": [draft(assistant, target, out, a) for a in ANCHORS]}
        if centroids:
            winner, lower = make_tie(assistant, target, out)
            save(assistant, "assistant_tie")
            tie = {"target": "target_ple", "tied_ids": [lower, winner]}
            tie["drafts"] = [draft(assistant, target, out, a) for a in ANCHORS]
            assert tie["drafts"][0]["tokens"][0] == lower, "the tie did not go to the lowest id"
            golden["assistants"]["assistant_tie"] = tie
    (OUT / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")
    size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
