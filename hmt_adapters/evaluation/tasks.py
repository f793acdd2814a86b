"""The long-context tasks as sample generators over a real-text haystack, each sample exactly `length` tokens.

- `passkey`: the passkey retrieval of Mohtashami & Jaggi (2023): a 5-digit key in the filler, asked at the end;
  over the essay haystack it is harder than the standard form;
- `passkey_standard`: the same task in the anchors' exact form (Landmark Attention's `run_test.py`, used by InfLLM):
  repeated noise "The grass is green. ...", "The pass key is X. Remember it. X is the pass key.";
- `passkey_update`: the standard passkey changed at later depths, the current (last) key asked for: retrieval by
  the question's words finds every statement alike, a memory written in order can overwrite;
- `niah_single_noise`: RULER's niah_single_1, the single needle in the same repeated noise;
- `niah_single`, `niah_multikey`, `niah_multivalue`, `variable_tracking`: RULER's formats (Hsieh et al., 2024),
  with its templates, needle sentence and answer prefixes. They are generated here, not by lm-eval's RULER code:
  that code needs `wonderwords` and nltk's punkt data (not installable offline) and re-tokenizes the whole prompt
  for every 500 words it adds (quadratic: hours at 1M tokens). Keys are adjective-noun words, values 7-digit numbers;
- `qa1`, `qa2`, `qa3`: BABILong-style (Kuratov et al., 2024) bAbI fact chains (single, two and three supporting
  facts) written procedurally and spread through real book text; answers are checked exactly.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

from .haystack import load_haystack
from .samples import Insert, Sample, build_sample

ADJECTIVES = (
    "ancient",
    "bitter",
    "brave",
    "calm",
    "clever",
    "crimson",
    "curious",
    "dusty",
    "eager",
    "fancy",
    "gentle",
    "golden",
    "hollow",
    "humble",
    "icy",
    "jolly",
    "lively",
    "lucky",
    "misty",
    "noble",
    "odd",
    "pale",
    "proud",
    "quiet",
    "rapid",
    "rusty",
    "shy",
    "silent",
    "sleepy",
    "steady",
    "swift",
    "tidy",
    "velvet",
    "wary",
    "wild",
)
NOUNS = (
    "anchor",
    "badger",
    "banjo",
    "beacon",
    "canyon",
    "castle",
    "comet",
    "cricket",
    "falcon",
    "feather",
    "glacier",
    "harbor",
    "island",
    "kettle",
    "lantern",
    "meadow",
    "monsoon",
    "orchard",
    "otter",
    "pebble",
    "pepper",
    "quarry",
    "raven",
    "saddle",
    "tractor",
    "trumpet",
    "tunnel",
    "violin",
    "walrus",
    "willow",
    "zephyr",
)
PERSONS = ("Mary", "John", "Daniel", "Sandra")
LOCATIONS = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
OBJECTS = ("apple", "football", "milk")
MOVES = ("moved to", "went to", "journeyed to", "travelled to", "went back to")

PASSKEY_HEAD = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there.\n"
)
RULER_NIAH_HEAD = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards.\n"
)
RULER_NEEDLE = "One of the special magic numbers for {key} is: {value}."
RULER_VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
RULER_VT_TAIL = (
    "\nQuestion: Find all variables that are assigned the value {query} in the text above. Answer: According to the "
    "chain(s) of variable assignment in the text above, {count} variables are assgined the value {query}, they are:"
)
QA_HEAD = (
    "I give you context with the facts about positions of different persons hidden in some random text and a "
    "question. You need to answer the question based only on the information from the facts.\n"
)


def _unique(draw: Callable[[], str], text: str, taken: set[str]) -> str:
    """A fresh `draw()` that occurs nowhere in the haystack `text` and is not `taken` (so it appears only where
    placed)."""
    for _ in range(1000):
        value = draw()
        if value not in taken and value not in text:
            taken.add(value)
            return value
    raise RuntimeError("Could not draw a value absent from the haystack in 1000 tries.")


def _depths(count: int, rng: random.Random, depth: float | None) -> list[float]:
    if depth is not None:
        if count != 1:
            raise ValueError(f"A fixed `depth` applies to one needle; this task places {count}.")
        return [depth]
    return sorted(rng.random() for _ in range(count))


# The passkey's question by the words it asks with: "number" shares only "the" with the needle (docs/trained_memory.md)
PASSKEY_QUESTIONS = {
    "pass key": "\nWhat is the pass key? The pass key is",
    "number": "\nWhich number was hidden in the text above? The number was",
}


def passkey(
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    *,
    seed: int = 0,
    depth: float | None = None,
    haystack: str = "essays",
    question: str = "pass key",
) -> Sample:
    """Passkey retrieval: "The pass key is 12345. Remember it." at `depth` (random if None), asked at the end.

    `question="number"` asks "Which number was hidden in the text above? The number was": no word of the needle but
    "the", so a reader that picks past blocks by the question's words (the default `"infllm"`) has nothing to match,
    where a model with the needle in view still answers (SmolLM2-135M: 25 of 30 prompts of 128 tokens, against 30 of
    30 with the "pass key" question; docs/trained_memory.md)."""
    if question not in PASSKEY_QUESTIONS:
        raise ValueError(f"`question` must be one of {list(PASSKEY_QUESTIONS)}, got {question!r}.")
    rng, hay = random.Random(seed), load_haystack(haystack, tokenizer)
    key = _unique(lambda: str(rng.randint(10000, 99999)), hay.text, set())
    needle = Insert(f"The pass key is {key}. Remember it.", _depths(1, rng, depth)[0])
    return build_sample(
        tokenizer,
        hay,
        length,
        PASSKEY_HEAD,
        [needle],
        PASSKEY_QUESTIONS[question],
        rng,
        task="passkey",
        answers=[key],
        query=question,
        extra={"metric": "first_number", "max_new_tokens": 8},
    )


LANDMARK_PASSKEY_HEAD = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there.\n"
)


def passkey_standard(
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    *,
    seed: int = 0,
    depth: float | None = None,
    haystack: str = "repeat",
) -> Sample:
    """The passkey in Landmark Attention's `run_test.py` form (Mohtashami & Jaggi 2023; InfLLM's passkey): the
    repeated noise haystack, "The pass key is X. Remember it. X is the pass key." with X in 1..50000, and the
    question "What is the pass key? The pass key is"."""
    rng, hay = random.Random(seed), load_haystack(haystack, tokenizer)
    key = _unique(lambda: str(rng.randint(1, 50000)), hay.text, set())
    needle = Insert(f"The pass key is {key}. Remember it. {key} is the pass key.", _depths(1, rng, depth)[0])
    return build_sample(
        tokenizer,
        hay,
        length,
        LANDMARK_PASSKEY_HEAD,
        [needle],
        "\nWhat is the pass key? The pass key is",
        rng,
        task="passkey_standard",
        answers=[key],
        query="pass key",
        extra={"metric": "first_number", "max_new_tokens": 8},
    )


def passkey_update(
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    *,
    seed: int = 0,
    depth: float | None = None,
    updates: int = 3,
    haystack: str = "repeat",
    keep_clear: int = 0,
) -> Sample:
    """The standard passkey set, then changed `updates - 1` times at later random depths ("The pass key has changed.
    The pass key is now X. ..."); the question asks for the current one, the last set. Every statement shares the
    question's words, so a reader that retrieves by them finds the stale keys as readily as the current one; a
    memory written in reading order can overwrite (ARMT's delta rule, Rodkin et al. 2024, §3). The earlier keys are
    kept in `extra["stale"]` (an answer that names one read a stale statement); the statement the answer rests on,
    the last, is `extra["supporting_facts"]`. The question ends as the changes read ("The pass key is now"), so the
    key is the next token: ending in "is", SmolLM2 first says " now" and then the key, which a teacher-forced check
    of the answer (as training scores it) counts wrong (2026-12-05, 1,024-token prompts: 0 of 50 so). `keep_clear`:
    no statement in the prompt's last `keep_clear` tokens (a segment length: only memory holds the keys)."""
    if updates < 1:
        raise ValueError(f"`updates` must be >= 1 (the statements of a key, the first included), got {updates}.")
    rng, hay = random.Random(seed), load_haystack(haystack, tokenizer)
    taken: set[str] = set()
    keys = [_unique(lambda: str(rng.randint(1, 50000)), hay.text, taken) for _ in range(updates)]
    first = f"The pass key is {keys[0]}. Remember it. {keys[0]} is the pass key."
    later = [f"The pass key has changed. The pass key is now {k}. Remember it. {k} is the pass key." for k in keys[1:]]
    needles = [Insert(t, d) for t, d in zip([first, *later], _depths(updates, rng, depth))]
    return build_sample(
        tokenizer,
        hay,
        length,
        LANDMARK_PASSKEY_HEAD,
        needles,
        "\nWhat is the pass key now? The pass key is now",
        rng,
        keep_clear=keep_clear,
        task="passkey_update",
        answers=[keys[-1]],
        query="pass key",
        extra={"metric": "first_number", "max_new_tokens": 8, "stale": keys[:-1], "supporting_facts": [updates - 1]},
    )


def niah(
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    *,
    num_keys: int = 1,
    num_values: int = 1,
    seed: int = 0,
    depth: float | None = None,
    haystack: str = "essays",
    task: str = "niah",
) -> Sample:
    """RULER needle-in-a-haystack: `num_keys` keys with `num_values` values each; one key is asked for, all its values
    are the answer (RULER's `string_match_all`)."""
    rng, hay = random.Random(seed), load_haystack(haystack, tokenizer)
    taken: set[str] = set()
    keys = [_unique(lambda: f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}", hay.text, taken) for _ in range(num_keys)]
    values = [
        [_unique(lambda: str(rng.randint(10**6, 10**7 - 1)), hay.text, taken) for _ in range(num_values)] for _ in keys
    ]
    texts = [RULER_NEEDLE.format(key=k, value=v) for k, vs in zip(keys, values) for v in vs]
    rng.shuffle(texts)
    needles = [Insert(t, d) for t, d in zip(texts, _depths(len(texts), rng, depth))]
    query = rng.choice(keys)
    answers = values[keys.index(query)]
    if len(answers) == 1:
        tail = (
            f"\nWhat is the special magic number for {query} mentioned in the provided text? "
            f"The special magic number for {query} mentioned in the provided text is"
        )
        head = RULER_NIAH_HEAD.replace("Some special magic numbers are", "A special magic number is")
    else:
        tail = (
            f"\nWhat are all the special magic numbers for {query} mentioned in the provided text? "
            f"The special magic numbers for {query} mentioned in the provided text are"
        )
        head = RULER_NIAH_HEAD
    return build_sample(
        tokenizer,
        hay,
        length,
        head,
        needles,
        tail,
        rng,
        task=task,
        answers=answers,
        query=query,
        extra={"metric": "all_contained", "max_new_tokens": 12 * len(answers)},
    )


def niah_single(tokenizer: PreTrainedTokenizerBase, length: int, **kw) -> Sample:
    """RULER niah_single: one needle, asked for."""
    return niah(tokenizer, length, task="niah_single", **kw)


def niah_single_noise(tokenizer: PreTrainedTokenizerBase, length: int, *, haystack: str = "repeat", **kw) -> Sample:
    """RULER niah_single_1: one needle (word key, 7-digit value) in the repeated noise haystack."""
    return niah(tokenizer, length, task="niah_single_noise", haystack=haystack, **kw)


def niah_multikey(tokenizer: PreTrainedTokenizerBase, length: int, **kw) -> Sample:
    """RULER niah_multikey: four needles of different keys, one asked for (three distractors)."""
    return niah(tokenizer, length, num_keys=4, task="niah_multikey", **kw)


def niah_multivalue(tokenizer: PreTrainedTokenizerBase, length: int, **kw) -> Sample:
    """RULER niah_multivalue: four values of one key, all asked for."""
    return niah(tokenizer, length, num_values=4, task="niah_multivalue", **kw)


def variable_tracking(
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    *,
    seed: int = 0,
    hops: int = 4,
    haystack: str = "essays",
    depth: float | None = None,
) -> Sample:
    """RULER variable tracking: `VAR A = 12345`, then `hops` assignments `VAR B = VAR A` spread in order through the
    filler; the answer is every variable holding the value."""
    if depth is not None:
        raise ValueError("variable_tracking spreads its chain at random depths; `depth` must be None.")
    rng, hay = random.Random(seed), load_haystack(haystack, tokenizer)
    taken: set[str] = set()
    names = [
        _unique(lambda: "".join(rng.choices(string.ascii_uppercase, k=5)), hay.text, taken) for _ in range(hops + 1)
    ]
    value = _unique(lambda: str(rng.randint(10000, 99999)), hay.text, taken)
    chain = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i + 1]} = VAR {names[i]}." for i in range(hops)]
    inserts = [Insert(t, d) for t, d in zip(chain, _depths(len(chain), rng, None))]
    tail = RULER_VT_TAIL.format(query=value, count=len(names))
    return build_sample(
        tokenizer,
        hay,
        length,
        RULER_VT_HEAD,
        inserts,
        tail,
        rng,
        task="variable_tracking",
        answers=names,
        query=value,
        extra={"metric": "all_contained", "max_new_tokens": 30},
    )


def _qa_story(kind: int, rng: random.Random, num_facts: int) -> tuple[list[str], str, str, list[int], str]:
    """A bAbI story of `num_facts` facts: (facts, question, answer, supporting fact indices, answer prefix).

    qa1: where is a person (their last move); qa2: where is an object (where its holder last went);
    qa3: where was an object before its last place (three supporting facts)."""
    for _ in range(1000):
        facts: list[str] = []
        place: dict[str, str] = {}
        holder: dict[str, str] = {}
        trail: dict[str, list[tuple[str, int]]] = {o: [] for o in OBJECTS}  # (place, supporting fact)
        support: dict[str, list[int]] = {}
        for _ in range(num_facts):
            person = rng.choice(PERSONS)
            free = [o for o in OBJECTS if o not in holder]
            if kind > 1 and free and person in place and rng.random() < 0.3:
                obj = rng.choice(free)
                holder[obj] = person
                facts.append(f"{person} picked up the {obj}.")
                support[obj] = [len(facts) - 1]
                trail[obj].append((place[person], support[person][0]))  # where it is: the holder's last move
                continue
            location = rng.choice([x for x in LOCATIONS if x != place.get(person)])
            place[person] = location
            facts.append(f"{person} {rng.choice(MOVES)} the {location}.")
            support[person] = [len(facts) - 1]
            for obj, who in holder.items():
                if who == person:
                    trail[obj].append((location, len(facts) - 1))
        if kind == 1 and place:
            person = rng.choice(sorted(place))
            return facts, f"Where is {person}?", place[person], support[person], f"{person} is in the"
        held = [o for o in holder if len(trail[o]) >= (2 if kind == 3 else 1)]
        if kind > 1 and held:
            obj = rng.choice(sorted(held))
            person = holder[obj]
            if kind == 2:
                return (
                    facts,
                    f"Where is the {obj}?",
                    place[person],
                    support[obj] + support[person],
                    f"The {obj} is in the",
                )
            (before, i), (last, j) = trail[obj][-2], trail[obj][-1]
            if before != last:
                return (
                    facts,
                    f"Where was the {obj} before the {last}?",
                    before,
                    sorted({support[obj][0], i, j}),
                    f"Before the {last}, the {obj} was in the",
                )
    raise RuntimeError(f"Could not draw a qa{kind} story of {num_facts} facts.")


def qa(
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    *,
    kind: int = 1,
    num_facts: int = 8,
    seed: int = 0,
    haystack: str = "kjv",
    depth: float | None = None,
) -> Sample:
    """BABILong-style qa1/qa2/qa3: the facts of one bAbI story spread in order through book text, question at the end;
    correct when the first generated word is the answer."""
    if kind not in (1, 2, 3):
        raise ValueError(f"`kind` must be 1, 2 or 3 (bAbI qa1-qa3), got {kind!r}.")
    if depth is not None:
        raise ValueError("qa spreads its facts at random depths; `depth` must be None.")
    rng, hay = random.Random(seed), load_haystack(haystack, tokenizer)
    facts, question, answer, support, prefix = _qa_story(kind, rng, num_facts)
    inserts = [Insert(f, d) for f, d in zip(facts, _depths(len(facts), rng, None))]
    tail = f"\nQuestion: {question} Answer: {prefix}"
    return build_sample(
        tokenizer,
        hay,
        length,
        QA_HEAD,
        inserts,
        tail,
        rng,
        task=f"qa{kind}",
        answers=[answer],
        query=question,
        extra={"metric": "first_word", "max_new_tokens": 4, "supporting_facts": support},
    )


TASKS: dict[str, Callable[..., Sample]] = {
    "passkey": passkey,
    "passkey_standard": passkey_standard,
    "passkey_update": passkey_update,
    "niah_single_noise": niah_single_noise,
    "niah_single": niah_single,
    "niah_multikey": niah_multikey,
    "niah_multivalue": niah_multivalue,
    "variable_tracking": variable_tracking,
    "qa1": lambda tokenizer, length, **kw: qa(tokenizer, length, kind=1, **kw),
    "qa2": lambda tokenizer, length, **kw: qa(tokenizer, length, kind=2, **kw),
    "qa3": lambda tokenizer, length, **kw: qa(tokenizer, length, kind=3, **kw),
}


SINGLE_NEEDLE_TASKS = ("passkey", "passkey_standard", "niah_single", "niah_single_noise")


def make_samples(
    task: str,
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    count: int,
    *,
    seed: int = 0,
    haystack: str | None = None,
    spread_depth: bool = True,
) -> list[Sample]:
    """`count` samples of `task` at `length` tokens (seeds `seed..seed+count-1`). Single-needle tasks spread their
    needle evenly over depths 0..1 across the samples when `spread_depth`."""
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; choose one of {sorted(TASKS)}.")
    kwargs = {} if haystack is None else {"haystack": haystack}
    single = task in SINGLE_NEEDLE_TASKS and spread_depth
    return [
        TASKS[task](tokenizer, length, seed=seed + i, depth=(i / max(count - 1, 1)) if single else None, **kwargs)
        for i in range(count)
    ]
