"""Evaluate a model through the OpenAI-compatible routes (docs/openai.md): the exact-match
accuracy of its greedy answers on held-out examples, with the official `openai` client.

    WHITNEY_API_URL=http://127.0.0.1:8765 WHITNEY_API_KEY=... \\
        python examples/openai_eval.py MODEL DATA.jsonl [--max-tokens N]

MODEL is a base model, `whitney://runs/<run>/samplers/<name>` or
`whitney://runs/<run>/states/<name>`; DATA.jsonl holds lines as `whitney-flows run sft` reads
them (`{"prompt", "completion"}` pairs or `{"messages": [...]}` conversations): the model
answers everything before each example's last assistant turn, which is the reference.
Needs `pip install openai`. Progress goes to stderr, the score to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys

import openai

from flows.sft.corpus import Example, read_examples


def evaluate(client: openai.OpenAI, model: str, examples: list[Example], max_tokens: int) -> int:
    """How many greedy answers equal their reference (surrounding whitespace aside)."""
    hits = 0
    for number, example in enumerate(examples, 1):
        answer = client.chat.completions.create(
            model=model,
            messages=example.conversation()[:-1],
            max_tokens=max_tokens,
            temperature=0,
        )
        hits += (answer.choices[0].message.content or "").strip() == example.completion.strip()
        print(f"{number}/{len(examples)}  exact {hits}", file=sys.stderr, flush=True)
    return hits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", metavar="MODEL")
    parser.add_argument("data", metavar="DATA.jsonl")
    parser.add_argument("--max-tokens", type=int, default=64, metavar="N")
    args = parser.parse_args()
    url, key = os.environ.get("WHITNEY_API_URL"), os.environ.get("WHITNEY_API_KEY")
    if not url or not key:
        print("openai_eval: set WHITNEY_API_URL and WHITNEY_API_KEY", file=sys.stderr)
        return 2
    examples = read_examples(args.data)
    with openai.OpenAI(base_url=f"{url.rstrip('/')}/v1", api_key=key) as client:
        hits = evaluate(client, args.model, examples, args.max_tokens)
    print(f"exact match {hits}/{len(examples)} ({100 * hits / len(examples):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
