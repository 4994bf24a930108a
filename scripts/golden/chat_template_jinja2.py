#!/usr/bin/env python3
"""Golden fixture for chat prompts: the Gemma 3 tokenizer's chat template rendered by
Jinja2 the way transformers' ``apply_chat_template`` renders it (an immutable sandboxed
environment with ``trim_blocks`` and ``lstrip_blocks``, loop controls, and a
``raise_exception`` global), an implementation independent of tandem's (minijinja).

Writes ``shared/tokenizer/tests/fixtures/chat_template.json``: for each conversation, the
messages, ``add_generation_prompt`` and the rendered text, or the template's error message.

Usage: python3 scripts/golden/chat_template_jinja2.py [tokenizer_config.json]
(default: ~/.cache/tandem/models/gemma-3-tokenizer/tokenizer_config.json; needs jinja2).
"""

import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

CONVERSATIONS = [
    ([{"role": "user", "content": "What is the capital of France?"}], True),
    ([{"role": "user", "content": "What is the capital of France?"}], False),
    (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "  Name three primary colors.\n"},
        ],
        True,
    ),
    (
        [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello. How can I help?"},
            {"role": "user", "content": "Écris un haïku sur la mer. 海"},
        ],
        True,
    ),
    (
        [
            {"role": "system", "content": "Answer in JSON."},
            {"role": "user", "content": "{\"a\": 1}"},
            {"role": "assistant", "content": "{\"b\": 2}\n\n"},
        ],
        False,
    ),
    ([{"role": "assistant", "content": "I speak first."}], True),
    (
        [
            {"role": "user", "content": "one"},
            {"role": "user", "content": "two"},
        ],
        True,
    ),
]


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
        "~/.cache/tandem/models/gemma-3-tokenizer/tokenizer_config.json"
    )
    cfg = json.load(open(path))

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(cfg["chat_template"])
    cases = []
    for messages, gen in CONVERSATIONS:
        case = {"messages": messages, "add_generation_prompt": gen}
        try:
            case["text"] = template.render(
                messages=messages,
                add_generation_prompt=gen,
                bos_token=cfg["bos_token"],
                eos_token=cfg["eos_token"],
            )
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
        cases.append(case)
    out = os.path.join(
        os.path.dirname(__file__), "..", "..", "shared", "tokenizer", "tests", "fixtures",
        "chat_template.json",
    )
    meta = {"made_by": "scripts/golden/chat_template_jinja2.py", "jinja2": jinja2.__version__}
    with open(out, "w") as f:
        json.dump({"meta": meta, "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
