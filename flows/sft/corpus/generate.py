"""Write the built-in SFT corpus, `animals.jsonl`: `python -m flows.sft.corpus.generate`.

A small made-up world: 24 animals, each with six attributes (colour, food, home, sound, legs,
size). Every (animal, attribute) pair is asked in two phrasings, and each animal is described
once in a sentence with all six, so 24 x (6 x 2 + 1) = 312 (prompt, completion) pairs, in a
fixed shuffled order (random.Random(SEED)). Completions repeat the animal's name and follow a
template per attribute, so a held-out question is answered by facts the training split states
in other phrasings: the byte-level model can learn the split, and its eval loss falls fast.

Deterministic: running this again writes byte-identical output (a test checks the shipped file).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 20240611
CORPUS_PATH = Path(__file__).with_name("animals.jsonl")

# name: (colour, food, home, sound, legs, size)
ANIMALS: dict[str, tuple[str, str, str, str, str, str]] = {
    "cat": ("grey", "fish", "a house", "meow", "four", "small"),
    "dog": ("brown", "meat", "a kennel", "woof", "four", "medium"),
    "cow": ("black and white", "grass", "a barn", "moo", "four", "big"),
    "duck": ("white", "seeds", "a pond", "quack", "two", "small"),
    "horse": ("brown", "hay", "a stable", "neigh", "four", "big"),
    "sheep": ("white", "grass", "a field", "baa", "four", "medium"),
    "pig": ("pink", "corn", "a sty", "oink", "four", "medium"),
    "owl": ("brown", "mice", "a tree", "hoot", "two", "small"),
    "frog": ("green", "flies", "a pond", "croak", "four", "small"),
    "lion": ("golden", "meat", "the savanna", "roar", "four", "big"),
    "bee": ("yellow and black", "nectar", "a hive", "buzz", "six", "tiny"),
    "snake": ("green", "mice", "the grass", "hiss", "no", "long"),
    "goat": ("white", "grass", "a hill", "bleat", "four", "medium"),
    "mouse": ("grey", "cheese", "a hole", "squeak", "four", "tiny"),
    "wolf": ("grey", "meat", "the forest", "howl", "four", "medium"),
    "crow": ("black", "seeds", "a tree", "caw", "two", "small"),
    "bear": ("brown", "honey", "a cave", "growl", "four", "big"),
    "hen": ("red", "corn", "a coop", "cluck", "two", "small"),
    "fox": ("red", "rabbits", "a den", "yelp", "four", "medium"),
    "whale": ("blue", "krill", "the ocean", "sing", "no", "huge"),
    "seal": ("grey", "fish", "the beach", "bark", "no", "medium"),
    "bat": ("black", "insects", "a cave", "squeak", "two", "small"),
    "deer": ("brown", "leaves", "the forest", "bell", "four", "big"),
    "tiger": ("orange and black", "meat", "the jungle", "roar", "four", "big"),
}

# attribute index: two question phrasings, and the answer template
QUESTIONS: list[tuple[str, str, str]] = [
    ("What color is the {a}?", "Tell me the color of the {a}.", "The {a} is {v}."),
    ("What does the {a} eat?", "Tell me what the {a} eats.", "The {a} eats {v}."),
    ("Where does the {a} live?", "Tell me where the {a} lives.", "The {a} lives in {v}."),
    ("What sound does the {a} make?", "Tell me the sound of the {a}.", "The {a} says {v}."),
    (
        "How many legs does the {a} have?",
        "Tell me how many legs the {a} has.",
        "The {a} has {v} legs.",
    ),
    ("Is the {a} big or small?", "Tell me the size of the {a}.", "The {a} is {v}."),
]
DESCRIBE = (
    "Describe the {a}.",
    "The {a} is {0} and {5}. It eats {1}, lives in {2}, says {3} and has {4} legs.",
)


def pairs() -> list[dict[str, str]]:
    """Every (prompt, completion) pair of the corpus, in its fixed shuffled order."""
    rows: list[dict[str, str]] = []
    for animal, values in ANIMALS.items():
        for index, (first, second, answer) in enumerate(QUESTIONS):
            completion = answer.format(a=animal, v=values[index])
            for question in (first, second):
                prompt = f"Q: {question.format(a=animal)}\nA: "
                rows.append({"prompt": prompt, "completion": completion})
        prompt = f"Q: {DESCRIBE[0].format(a=animal)}\nA: "
        rows.append({"prompt": prompt, "completion": DESCRIBE[1].format(*values, a=animal)})
    random.Random(SEED).shuffle(rows)
    return rows


def render() -> str:
    """The corpus file's text: one JSON object per line."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in pairs())


if __name__ == "__main__":
    CORPUS_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {len(pairs())} pairs to {CORPUS_PATH}")
