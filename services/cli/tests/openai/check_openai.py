"""Drives tandem's OpenAI-compatible HTTP API with the official `openai` client.

    check_openai.py BASE_URL                  run every check; exits 1 if any fails
    check_openai.py BASE_URL --greedy PROMPT MAX_TOKENS
                                              print, as JSON, the greedy texts of PROMPT
                                              from /v1/completions (speculation on and
                                              off) and /v1/chat/completions (one user
                                              message); services/cli/tests/openai.rs
                                              compares them with gRPC and plain decoding

BASE_URL is e.g. http://127.0.0.1:8000/v1. Run with the venv of scripts/openai-venv.sh.
The checks are written for the real Gemma 3 270M (scripts/fetch-models.sh).
"""

import json
import sys
import traceback

import openai

# Gemma 3's id of "," (a token id that is fixed by the tokenizer, for stop_token_ids).
COMMA_ID = 236764
COUNTING = "1, 2, 3,"
CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]


def greedy(client, model, prompt, max_tokens, **extra):
    """The greedy completion of `prompt` (extension fields through extra_body)."""
    return client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body=extra or None,
    )


def chat(client, model, messages, max_tokens, **kw):
    """A chat completion, greedy unless `kw` says otherwise."""
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, **kw
    )


def check_models(client, model):
    models = client.models.list().data
    assert [m.id for m in models] == [model], [m.id for m in models]
    assert models[0].object == "model", models[0]
    assert models[0].owned_by, models[0]


def check_completion_and_max_tokens(client, model):
    out = greedy(client, model, COUNTING, 6)
    c = out.choices[0]
    assert out.object == "text_completion", out.object
    assert out.model == model, out.model
    assert c.text.startswith(" 4, 5,"), repr(c.text)
    assert c.finish_reason == "length", c.finish_reason
    u = out.usage
    assert u.completion_tokens == 6, u
    assert u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + 6, u


def check_completion_stream(client, model):
    plain = greedy(client, model, COUNTING, 8).choices[0]
    chunks = list(
        client.completions.create(
            model=model,
            prompt=COUNTING,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.text, (text, plain.text)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and not any(reasons[:-1]), reasons
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8, chunks[-1]


def check_chat_and_stream(client, model):
    out = chat(client, model, CHAT, 12)
    c = out.choices[0]
    assert out.object == "chat.completion", out.object
    assert c.message.role == "assistant", c.message
    assert c.message.content, c.message
    assert c.finish_reason == "length" and out.usage.completion_tokens == 12, (c, out.usage)
    chunks = list(chat(client, model, CHAT, 12, stream=True))
    assert all(k.object == "chat.completion.chunk" for k in chunks), chunks[0]
    text = "".join(k.choices[0].delta.content or "" for k in chunks if k.choices)
    assert text == c.message.content, (text, c.message.content)
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    assert chunks[-1].choices[0].finish_reason == "length", chunks[-1]


def check_stop(client, model):
    full = greedy(client, model, COUNTING, 12).choices[0].text
    assert " 6" in full, repr(full)
    out = client.completions.create(
        model=model, prompt=COUNTING, max_tokens=12, temperature=0, stop=[" 6", "never"]
    )
    c = out.choices[0]
    assert c.text == full[: full.index(" 6")], (c.text, full)
    assert c.finish_reason == "stop", c.finish_reason
    s = chat(client, model, CHAT, 12, stop="\n", stream=True)
    text = "".join(k.choices[0].delta.content or "" for k in s if k.choices)
    assert "\n" not in text, repr(text)


def check_chat_logprobs(client, model):
    out = chat(client, model, CHAT, 8, logprobs=True, top_logprobs=3)
    c = out.choices[0]
    content = c.logprobs.content
    assert len(content) == out.usage.completion_tokens == 8, (len(content), out.usage)
    assert "".join(t.token for t in content) == c.message.content, content
    for t in content:
        assert t.logprob <= 0, t
        tops = [x.logprob for x in t.top_logprobs]
        assert len(tops) == 3, t
        assert all(x <= 0 for x in tops) and tops == sorted(tops, reverse=True), t
        # Greedy: the chosen token is the most likely one.
        assert abs(t.logprob - tops[0]) < 1e-4, t
        assert t.top_logprobs[0].token == t.token, t


def check_completion_logprobs(client, model):
    out = client.completions.create(
        model=model, prompt=COUNTING, max_tokens=6, temperature=0, logprobs=2
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6, lp
    assert "".join(lp.tokens) == out.choices[0].text, lp
    assert all(x <= 0 for x in lp.token_logprobs), lp.token_logprobs
    assert lp.text_offset == sorted(lp.text_offset), lp.text_offset
    for tok, p, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3, top
        assert all(v <= 0 for v in top.values()), top
        assert abs(max(top.values()) - p) < 1e-4, (tok, p, top)


# Seeded samples repeat with plain decoding only: with speculation on, how many tokens a
# round drafts varies from run to run, and so does which random numbers each token uses.
PLAIN = {"speculative": False}


def check_seed(client, model):
    def sample(seed, extra):
        return client.completions.create(
            model=model,
            prompt="Once upon a time",
            max_tokens=16,
            temperature=0.8,
            seed=seed,
            extra_body=extra,
        ).choices[0].text

    first = sample(7, {})
    assert sample(7, {}) == first, "the same seed gave another text"
    assert sample(7, PLAIN) == first, "the seed's text changed without speculation"
    others = {sample(s, {}) for s in (8, 9, 10)}
    assert others != {first}, "every seed gave the same text"


def check_n(client, model):
    out = client.completions.create(
        model=model,
        prompt="Once upon a time",
        max_tokens=8,
        temperature=0.8,
        seed=3,
        n=2,
    )
    assert sorted(c.index for c in out.choices) == [0, 1], out.choices
    used = out.usage.completion_tokens
    assert 2 <= used <= 16, out.usage
    if all(c.finish_reason == "length" for c in out.choices):
        assert used == 16, ("usage counts every choice", out.usage)
    one = client.completions.create(
        model=model,
        prompt="Once upon a time",
        max_tokens=8,
        temperature=0.8,
        seed=3,
    )
    first = next(c for c in out.choices if c.index == 0)
    assert first.text == one.choices[0].text, (first.text, one.choices[0].text)
    streamed = chat(client, model, CHAT, 6, n=2, stream=True, temperature=0.8, seed=3)
    indexes = {k.choices[0].index for k in streamed if k.choices}
    assert indexes == {0, 1}, indexes


def check_extensions(client, model):
    base = greedy(client, model, COUNTING, 10).choices[0].text
    assert greedy(client, model, COUNTING, 10, speculative=False).choices[0].text == base
    assert greedy(client, model, COUNTING, 10, max_gamma=2).choices[0].text == base
    # At temperature 0.8, top_k 1 and min_p 1 keep only the most likely token: greedy.
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        text = client.completions.create(
            model=model, prompt=COUNTING, max_tokens=10, temperature=0.8, seed=5, extra_body=extra
        ).choices[0].text
        assert text == base, (extra, text, base)
    penalised = greedy(client, model, COUNTING, 10, repetition_penalty=2.0).choices[0].text
    assert penalised != base, ("repetition_penalty changed nothing", base)
    out = greedy(client, model, COUNTING, 10, stop_token_ids=[COMMA_ID])
    c = out.choices[0]
    # " 4," then the comma ends it (whether its text is kept is the server's choice).
    assert c.finish_reason == "stop" and out.usage.completion_tokens <= 3, (c, out.usage)
    assert c.text in (" 4", " 4,"), repr(c.text)
    # min_tokens holds the stop token back: at least 6 tokens.
    out = greedy(client, model, COUNTING, 10, stop_token_ids=[COMMA_ID], min_tokens=6)
    assert out.usage.completion_tokens >= 6, (out.choices[0], out.usage)
    free = greedy(client, model, COUNTING, 10, ignore_eos=True, stop_token_ids=[COMMA_ID])
    assert free.choices[0].finish_reason == "stop", ("stop ids end it still", free.choices[0])


def check_errors(client, model):
    def refused(kind, call):
        try:
            call()
        except kind as e:
            assert isinstance(e.body, dict) and e.body.get("message"), e.body
            return
        raise AssertionError(f"no {kind.__name__}")

    refused(openai.NotFoundError, lambda: greedy(client, "no-such-model", "x", 1))
    refused(
        openai.NotFoundError,
        lambda: client.chat.completions.create(model="no-such-model", messages=CHAT),
    )
    # Out of tandem's ranges (temperature >= 0, 0 < top_p <= 1; above OpenAI's 2 is allowed).
    for field, value in (("temperature", -1.0), ("top_p", 1.5), ("top_p", 0.0)):
        refused(
            openai.BadRequestError,
            lambda: client.completions.create(
                model=model, prompt="x", max_tokens=1, **{field: value}
            ),
        )
        refused(openai.BadRequestError, lambda: chat(client, model, CHAT, 1, **{field: value}))
    refused(openai.BadRequestError, lambda: chat(client, model, [], 1))
    refused(
        openai.BadRequestError,
        lambda: client.post("/chat/completions", body={"model": model}, cast_to=object),
    )


CHECKS = [
    check_models,
    check_completion_and_max_tokens,
    check_completion_stream,
    check_chat_and_stream,
    check_stop,
    check_chat_logprobs,
    check_completion_logprobs,
    check_seed,
    check_n,
    check_extensions,
    check_errors,
]


def main(argv):
    if len(argv) not in (2, 5) or (len(argv) == 5 and argv[2] != "--greedy"):
        print(__doc__, file=sys.stderr)
        return 2
    client = openai.OpenAI(base_url=argv[1], api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    if len(argv) == 5:
        prompt, max_tokens = argv[3], int(argv[4])
        texts = {
            "completion": greedy(client, model, prompt, max_tokens).choices[0].text,
            "completion_plain": greedy(client, model, prompt, max_tokens, speculative=False)
            .choices[0]
            .text,
            "chat": chat(client, model, [{"role": "user", "content": prompt}], max_tokens)
            .choices[0]
            .message.content,
        }
        print(json.dumps(texts))
        return 0
    failed = 0
    for check in CHECKS:
        try:
            check(client, model)
            print(f"ok   {check.__name__}")
        except Exception:  # an assertion, an API error, anything: report and go on
            failed += 1
            print(f"FAIL {check.__name__}")
            traceback.print_exc(file=sys.stdout)
    print(f"openai {openai.__version__}: {len(CHECKS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
