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
* ``golden_dists.json`` (from the checkpoints on disk, so that it can be made again without
  touching them: ``--dists-only``): for each assistant and anchor, the head's full logits
  at every draft step, teacher-forced by the greedy drafts of ``golden.json``, and the
  distribution transformers' sampling warpers (temperature, then top-k, then top-p, as
  ``generate`` orders them, then softmax) make of them under a few sampling settings: the
  ids of non-zero probability and their probabilities. The centroid head's logits are
  transformers' scattered row: candidates scored, every other id at the candidates'
  minimum minus 1 (not -inf, so they keep some probability).

All in float32, eager attention, on CPU. Nothing of tandem's Rust code is involved.

How to run
----------
    python3 -m venv venv-ref && venv-ref/bin/pip install torch transformers
    venv-ref/bin/python scripts/golden/gemma4_transformers.py               # everything
    venv-ref/bin/python scripts/golden/gemma4_transformers.py --dists-only  # golden_dists.json
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
import transformers
from transformers import (
    Gemma4AssistantConfig,
    Gemma4AssistantForCausalLM,
    Gemma4ForCausalLM,
    Gemma4TextConfig,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "shared/gemma/tests/fixtures/gemma4"
PROMPT = [2, 17, 200, 45, 99, 3, 128, 77, 250, 5, 61, 143]
N_GREEDY = 8
N_DRAFT = 6
ANCHORS = [11, 6]
ASSISTANTS = ["assistant_centroids", "assistant_dense", "assistant_tie"]
# Sampling settings of golden_dists.json. Top-k stays below the centroid head's 64
# candidates, so that no boundary falls among the equal logits of the other ids.
SETTINGS = [
    {"temperature": 1.0, "top_k": None, "top_p": 1.0},
    {"temperature": 0.7, "top_k": 20, "top_p": 1.0},
    {"temperature": 0.7, "top_k": 20, "top_p": 0.9},
]
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


def prompt_forward(model: Gemma4ForCausalLM):
    with torch.no_grad():
        return model(torch.tensor([PROMPT]), output_hidden_states=True, return_shared_kv_states=True, use_cache=False)


def run_target(model: Gemma4ForCausalLM) -> tuple[dict, object]:
    out = prompt_forward(model)
    with torch.no_grad():
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


def assistant_steps(assistant, target, out, anchor: int, choose):
    """transformers' SinglePositionMultiTokenCandidateGenerator loop, on a prefix: yields the
    logits and the next hidden state of each of N_DRAFT steps; ``choose(step, logits)`` is
    the token fed to the next step."""
    n = anchor + 1
    kv = {k: (v[0][:, :, :n], v[1][:, :, :n]) for k, v in out.shared_kv_states.items()}
    hidden = out.hidden_states[-1][:, anchor : anchor + 1]
    token = torch.tensor([[PROMPT[anchor]]])
    position = torch.tensor([[anchor]])
    with torch.no_grad():
        for step in range(N_DRAFT):
            emb = target.get_input_embeddings()(token)
            res = assistant(
                inputs_embeds=torch.cat([emb, hidden], dim=-1),
                attention_mask=torch.ones(1, n, dtype=torch.long),
                position_ids=position,
                shared_kv_states=kv,
                use_cache=False,
            )
            logits = res.logits[0, -1]
            token = torch.tensor([[choose(step, logits)]])
            hidden = res.last_hidden_state
            yield logits, hidden[0, 0]


def draft(assistant, target, out, anchor: int) -> dict:
    """Greedy drafts: the argmax is fed to the next step, as transformers does."""
    tokens, winners, hiddens = [], [], []
    argmax = lambda _, logits: int(logits.argmax(dim=-1))
    for logits, hidden in assistant_steps(assistant, target, out, anchor, argmax):
        tokens.append(int(logits.argmax(dim=-1)))
        winners.append(float(logits.max()))
        hiddens.append(hidden.tolist())
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


def f32(x: float) -> float:
    """Nine significant digits: enough to read back the same float32."""
    return float(f"{x:.9g}")


def processed(logits: torch.Tensor, setting: dict) -> dict:
    """The distribution transformers samples from under ``setting``: its warpers in
    ``generate``'s order, then softmax; the ids of non-zero probability."""
    warpers = LogitsProcessorList()
    if setting["temperature"] != 1.0:
        warpers.append(TemperatureLogitsWarper(setting["temperature"]))
    if setting["top_k"] is not None:
        warpers.append(TopKLogitsWarper(setting["top_k"]))
    if setting["top_p"] < 1.0:
        warpers.append(TopPLogitsWarper(setting["top_p"]))
    probs = warpers(torch.tensor([PROMPT]), logits[None].clone())[0].softmax(dim=-1)
    ids = torch.nonzero(probs).flatten()
    if setting["top_p"] < 1.0:
        # The kept mass must clear top-p with a margin: no boundary decided by rounding.
        before = LogitsProcessorList(warpers[:-1])(torch.tensor([PROMPT]), logits[None].clone())
        kept = before[0].softmax(dim=-1)[ids]
        top_p, mass, spare = setting["top_p"], float(kept.sum()), float(kept.sum() - kept.min())
        assert spare < top_p - 1e-4 and mass > top_p + 1e-4, f"top-p boundary too close: {spare}, {mass}"
    return {"ids": ids.tolist(), "probs": [f32(p) for p in probs[ids].tolist()]}


def assistant_dists(assistant, target, out, drafts: list[dict]) -> list[dict]:
    """Per anchor, the logits of every step fed the golden greedy tokens, and their
    distributions under SETTINGS."""
    cases = []
    for d in drafts:
        forced = lambda step, _, tokens=d["tokens"]: tokens[step]
        logits = [l for l, _ in assistant_steps(assistant, target, out, d["anchor"], forced)]
        assert [int(l.argmax()) for l in logits] == d["tokens"], "not the golden greedy drafts"
        cases.append({
            "anchor": d["anchor"],
            "tokens": d["tokens"],
            "logits": [[f32(x) for x in l.tolist()] for l in logits],
            "dists": [[processed(l, s) for l in logits] for s in SETTINGS],
        })
    return cases


def write_dists() -> None:
    """golden_dists.json from the checkpoints and greedy drafts already in OUT."""
    golden = json.loads((OUT / "golden.json").read_text())
    load = dict(attn_implementation="eager", dtype=torch.float32)
    target = Gemma4ForCausalLM.from_pretrained(OUT / "target_ple", **load).eval()
    out = prompt_forward(target)
    record = {"generator": generator(), "settings": SETTINGS, "assistants": {}}
    for name in ASSISTANTS:
        assistant = Gemma4AssistantForCausalLM.from_pretrained(OUT / name, **load).eval()
        drafts = golden["assistants"][name]["drafts"]
        record["assistants"][name] = assistant_dists(assistant, target, out, drafts)
    (OUT / "golden_dists.json").write_text(json.dumps(record, separators=(",", ":")) + "\n")
    print(f"wrote {OUT / 'golden_dists.json'}")


def generator() -> dict:
    return {
        "script": "scripts/golden/gemma4_transformers.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32",
    }


def save(model, name: str) -> Path:
    path = OUT / name
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path)
    (path / "generation_config.json").unlink(missing_ok=True)
    return path


def main() -> None:
    torch.set_num_threads(2)
    if sys.argv[1:] == ["--dists-only"]:
        write_dists()
        return
    OUT.mkdir(parents=True, exist_ok=True)
    golden = {
        "generator": generator(),
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
    write_dists()


if __name__ == "__main__":
    main()
