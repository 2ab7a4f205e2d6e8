"""A Hugging Face model of the server's cache (tests/hfmodels/builders.py) through
`/v1/chat/completions`: the prompt is its chat template's (as transformers renders it), and
the greedy answer is a Whitney `sample` with top_k 1 of that prompt on a run of the model; a
stream of random draws, decoded by the model's own tokenizer, joins to the whole answer."""

from __future__ import annotations

from pathlib import Path

import openai
import transformers

from tests.hfmodels.builders import QWEN_REPO
from tests.local.helpers import http, new_run, run_op, sample_request
from whitney import hf_cache
from whitney.local import EmbeddedWhitney

MESSAGES = [{"role": "user", "content": "the cat sat"}]


def test_a_cached_models_chat_is_its_template_and_whitneys_greedy_sample(
    hf_cache_dir: Path,
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        hf_cache.snapshot(QWEN_REPO, hf_cache_dir)
    )
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    stops = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    with EmbeddedWhitney(api_keys=["hf-key"], session_ttl_s=0, hf_cache=hf_cache_dir) as server:
        with http(server) as api:
            run_id = new_run(api, base_model=QWEN_REPO, lora_rank=2)["run_id"]
            run_op(api, run_id, 1, "save_weights_for_sampler", {"name": "s"})
            request = sample_request(prompt, 1, 8, top_k=1, stop_token_ids=stops)
            op = run_op(api, run_id, 2, "sample", request, "s")
        tokens = op["result"]["sequences"][0]["tokens"]
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="hf-key", max_retries=0) as c:
            for model in (QWEN_REPO, f"whitney://runs/{run_id}/samplers/s"):
                answer = c.chat.completions.create(
                    model=model, messages=MESSAGES, max_tokens=8, temperature=0
                )
                assert answer.usage.prompt_tokens == len(prompt)
                content = [t for t in tokens if t not in stops]
                assert answer.choices[0].message.content == tokenizer.decode(content)
            request = {"model": QWEN_REPO, "messages": MESSAGES, "max_tokens": 12, "n": 2}
            whole = c.chat.completions.create(**request, seed=3)
            joined = ["", ""]
            for chunk in c.chat.completions.create(**request, seed=3, stream=True):
                joined[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
            assert joined == [choice.message.content for choice in whole.choices]
