"""Instruction-style requests for build.py's `tasks` kind: what users of an assistant send,
composed from the training packages' own text (python3 stdlib only, deterministic).

The `instructions` kind asks one short thing about a topic ("Write a poem about X."); the
requests users send are longer and carry more: details to include, a passage to work on, a
role to play, a format and limits to keep. These are composed here from templates written
for tandem, topics, and passages from the prose and code the training build already reads
(State of the Union speeches before 2001, Moby-Dick, SpamAssassin ham e-mails, the Brown
corpus, nlp-corpus sentences, reasoning-gym codeio programs). No evaluation source
(MT-Bench, IFBench, HumanEval, gsm_symbolic templates 80-99, speeches from 2001 on) is read.
"""

import random
import re

SEED = 20261207

AUDIENCES = ["a ten-year-old", "a busy manager", "a first-year university student", "my grandmother",
             "a new employee", "a skeptical investor", "a group of tourists", "a high-school class",
             "a software engineer", "a nurse", "a small-business owner", "a retired teacher"]
TONES = ["friendly", "formal", "enthusiastic", "calm", "humorous", "persuasive", "neutral",
         "warm", "concise", "professional"]
FORMS = ["blog post", "email", "short story", "speech", "newsletter item", "cover letter",
         "product review", "press release", "poem", "LinkedIn post", "diary entry", "essay",
         "letter of complaint", "toast for a wedding", "podcast introduction", "travel guide entry"]
ROLES = ["a ship's captain in the 1800s", "a famous chef", "a detective in a noir film",
         "a patient math tutor", "a museum guide", "a medieval knight", "a park ranger",
         "a customer support agent for an internet provider", "a personal trainer",
         "a travel agent", "a librarian", "a sports commentator", "an astronaut on the space station",
         "a startup founder pitching to investors", "a career coach", "a gardener",
         "a history professor", "a barista", "a village doctor", "a job interviewer"]
PLACES = ["Lisbon", "Kyoto", "the Scottish Highlands", "Cape Town", "Vancouver", "Marrakech",
          "Iceland", "Buenos Aires", "the Amalfi Coast", "Prague", "Hanoi", "New Zealand",
          "Istanbul", "Chicago", "the Swiss Alps", "Mexico City"]
LANGUAGES = ["Python", "JavaScript", "Rust", "C++", "Java", "Go", "TypeScript", "C#"]
EXTRACTS = ["the names of all people", "every place mentioned", "all dates and numbers",
            "the main claims", "every organization named", "the three most important facts",
            "any actions the writer asks for", "the key terms"]
OUTPUTS = ["a JSON object", "a bulleted list", "a table with two columns", "one line per item",
           "a numbered list", "comma-separated values"]

CONSTRAINTS = [
    "Keep your answer under {n} words.", "Use at least {k} bullet points.",
    "Write exactly {k} paragraphs, separated by blank lines.", "Do not use any commas.",
    "End your answer with the sentence \"Is there anything else I can help with?\"",
    "Give your answer a title in double angle brackets, like <<title>>.",
    "Answer in all lowercase letters.", "Include the keywords \"{w1}\" and \"{w2}\".",
    "Highlight at least {k} sections with markdown, like *highlighted section*.",
    "Start your answer with the word \"{w1}\".", "Wrap your entire answer in double quotes.",
    "Finish with a postscript starting with P.S.", "Use no more than {k} sentences.",
    "Answer in the form of a numbered list.", "Avoid the word \"{w1}\" entirely.",
    "Write it so that {a} can follow it.", "Use a {tone} tone.",
]
WORDS = ["future", "balance", "journey", "simple", "quality", "community", "energy", "trust",
         "growth", "history", "design", "health", "water", "freedom", "team", "light"]


def constraint(rng):
    return rng.choice(CONSTRAINTS).format(
        n=rng.choice([50, 80, 100, 150, 200, 300]), k=rng.randint(2, 5), w1=rng.choice(WORDS),
        w2=rng.choice(WORDS), a=rng.choice(AUDIENCES), tone=rng.choice(TONES))


def writing(rng, topic):
    form, tone = rng.choice(FORMS), rng.choice(TONES)
    asks = [
        f"Write a {tone} {form} about {topic} for {rng.choice(AUDIENCES)}.",
        f"Compose a {form} about {topic}. Mention at least two surprising details and end with a question for the reader.",
        f"Draft a {tone} {form} inviting people to an event about {topic}. Include the date, the place and why they should come.",
        f"Write a {form} set in {rng.choice(PLACES)} that involves {topic}.",
        f"I need a {form} about {topic}. It should have an introduction, two main points and a short conclusion.",
        f"Can you help me write a {form}? The subject is {topic}, and the reader is {rng.choice(AUDIENCES)}.",
        f"Write a short dialogue between {rng.choice(ROLES)} and {rng.choice(ROLES)} about {topic}.",
        f"Describe {topic} using vivid sensory details, as the opening paragraph of a novel.",
    ]
    return rng.choice(asks)


def roleplay(rng, topic):
    role = rng.choice(ROLES)
    asks = [
        f"Pretend you are {role}. Someone asks you about {topic}. What do you say?",
        f"Act as {role}. In character, explain {topic} to a newcomer.",
        f"You are {role}. Stay in character and answer: what is the hardest part of your day?",
        f"Imagine you are {role} and you have just been told about {topic}. Describe your reaction.",
        f"Take on the role of {role}. Give me three pieces of advice about {topic}.",
        f"Let's play a game: you are {role} and I am a visitor from {rng.choice(PLACES)}. Greet me and tell me about {topic}.",
    ]
    return rng.choice(asks)


def knowledge(rng, topic, topics):
    asks = [
        f"Explain {topic} to {rng.choice(AUDIENCES)}. Then give one everyday example.",
        f"What are the main causes and effects of {topic}? Answer in two parts.",
        f"Compare {topic} and {rng.choice(topics)}. How are they alike, and how do they differ?",
        f"Give a short overview of {topic}: where it comes from, why it matters, and one common misconception.",
        f"What would happen if {topic} suddenly disappeared? Think through the consequences step by step.",
        f"List five questions a curious student might ask about {topic}, and answer each in one or two sentences.",
        f"Describe how {topic} has changed over the last hundred years.",
        f"Evaluate the following claim: \"{topic.capitalize()} matters more today than ever before.\" Give arguments for and against.",
    ]
    return rng.choice(asks)


def planning(rng, topic):
    place, days = rng.choice(PLACES), rng.randint(2, 7)
    asks = [
        f"Plan a {days}-day trip to {place} for a family with two children. Include one activity related to {topic}.",
        f"Create a weekly schedule for someone who wants to learn about {topic} in one month.",
        f"I have a budget of ${rng.randint(2, 50) * 100}. Help me plan an event about {topic} for {rng.randint(10, 200)} guests.",
        f"Make a checklist for preparing a presentation on {topic}.",
        f"Suggest a {days}-step plan to start a small business connected to {topic}, with a rough cost for each step.",
        f"Design a lesson plan about {topic} for {rng.choice(AUDIENCES)}, with goals, activities and a short quiz.",
    ]
    return rng.choice(asks)


def on_passage(rng, passage, review=None):
    if review is not None:
        return rng.choice([
            f"Classify the sentiment of this review as positive, negative or neutral, and explain why:\n\n{review}",
            f"Rate the following review on a scale of 1 to 5, where 1 is very negative and 5 very positive:\n\n{review}",
        ])
    asks = [
        f"Summarize the following text in {rng.randint(2, 4)} sentences:\n\n{passage}",
        f"Extract {rng.choice(EXTRACTS)} from the text below. Return them as {rng.choice(OUTPUTS)}.\n\n{passage}",
        f"Rewrite this passage in a {rng.choice(TONES)} tone for {rng.choice(AUDIENCES)}:\n\n{passage}",
        f"Read the passage and write three questions that it answers, with their answers.\n\n{passage}",
        f"Suggest a title for the following text and explain your choice.\n\n{passage}",
        f"Edit the following paragraph to correct any grammar or spelling mistakes and make it easier to read:\n\n{passage}",
        f"{passage}\n\nWhat is the main point of the text above? Answer briefly.",
        f"Here is a text:\n\n{passage}\n\nIdentify the writer's purpose and the audience they had in mind.",
        f"Turn the following text into {rng.choice(OUTPUTS)} of its key points:\n\n{passage}",
        f"Write a reply to this message:\n\n{passage}",
    ]
    return rng.choice(asks)


def coding(rng, item):
    lang, task = rng.choice(LANGUAGES), item["task_description"].strip()
    code = item["code_sample"].strip()
    if len(code) > 700:
        code = code[:700].rsplit("\n", 1)[0]
    asks = [
        f"Write a {lang} function for the following task. {task}",
        f"{task}\n\nImplement this in {lang} and explain the time complexity of your solution.",
        f"Here is a Python function:\n\n```\n{code}\n```\n\nExplain what it does, step by step.",
        f"Can you find any bugs in this code and suggest improvements?\n\n```python\n{code}\n```",
        f"Write unit tests for the following function:\n\n```python\n{code}\n```",
        f"Translate this Python code into {lang}:\n\n```python\n{code}\n```",
        f"{task} Write the solution in {lang}, with comments, and give an example of its use.",
    ]
    return rng.choice(asks)


def puzzle(rng):
    names = rng.sample(["Alice", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo"], 4)
    a, b, c = rng.randint(3, 40), rng.randint(2, 9), rng.randint(2, 12)
    asks = [
        f"{names[0]} is {b} years older than {names[1]}, and {names[1]} is twice as old as {names[2]}, who is {c}. How old is {names[0]}? Explain your reasoning.",
        f"{names[0]} is taller than {names[1]}. {names[2]} is shorter than {names[1]} but taller than {names[3]}. Who is the shortest? Think step by step.",
        f"A shop sells pens at ${b} each and notebooks at ${c} each. {names[0]} buys {a % 7 + 1} pens and {a % 5 + 2} notebooks. How much does {names[0]} spend?",
        f"If it takes {b} workers {c} hours to paint a fence, how long would it take {b + 2} workers at the same pace?",
        f"What is the next number in the sequence {a}, {a + b}, {a + 2 * b}, {a + 3 * b}, ...? Explain the pattern.",
        f"Four friends, {', '.join(names[:3])} and {names[3]}, sit in a row. {names[0]} is not at either end, and {names[1]} sits next to {names[3]}. Give one seating that works.",
        f"A train leaves at {b}:{c * 4 % 60:02d} and travels {a * 10} km at {a % 6 * 10 + 60} km per hour. When does it arrive?",
    ]
    return rng.choice(asks)


def present(rng, ask):
    """The request with a constraint sometimes, in one of the forms requests arrive in."""
    if rng.random() < 0.4:
        ask = f"{ask} {constraint(rng)}"
    return rng.choice([
        f"User: {ask}\nAssistant:",
        f"<start_of_turn>user\n{ask}<end_of_turn>\n<start_of_turn>model\n",
        f"Question: {ask}\nAnswer:",
        ask,
    ])


def readable(piece):
    """Running prose: no markup, code or quoting marks, and mostly letters."""
    if re.search(r"[{}<>=|\\_@#*]|--|http", piece):
        return False
    return sum(c.isalpha() or c in " .,'\"" for c in piece) / len(piece) > 0.93


def passages(texts, rng, want):
    """`want` passages of 250-700 characters from the texts, cut at sentence ends."""
    out = []
    for _ in range(want * 8):
        if len(out) >= want:
            break
        text = re.sub(r"\s+", " ", rng.choice(texts)).strip()
        if len(text) < 300:
            continue
        start = rng.randrange(0, max(1, len(text) - 700))
        dot = text.find(". ", start) if start else -2
        if not -2 <= dot - start < 200:
            continue
        piece = text[dot + 2:][:700]
        piece = piece[: piece.rfind(". ") + 1]
        if len(piece) >= 250 and readable(piece):
            out.append(piece)
    return out


def tasks(topics, prose_texts, reviews, code_items, count=12000):
    """`count` requests as chat prompts, in a seeded shuffle."""
    rng = random.Random(SEED)
    texts = passages(prose_texts, rng, count // 4)

    def about(write):
        return lambda: write(rng, rng.choice(topics))

    def passage():
        review = rng.choice(reviews) if rng.random() < 0.15 else None
        return on_passage(rng, rng.choice(texts), review)

    kinds = [
        (about(writing), 18),
        (about(roleplay), 10),
        (lambda: knowledge(rng, rng.choice(topics), topics), 16),
        (about(planning), 8),
        (passage, 24),
        (lambda: coding(rng, rng.choice(code_items)), 16),
        (lambda: puzzle(rng), 8),
    ]
    makers, weights = [k for k, _ in kinds], [w for _, w in kinds]
    return [present(rng, rng.choices(makers, weights)[0]()) for _ in range(count)]
