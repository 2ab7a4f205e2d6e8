"""The smoke of a real pretrained model, end to end (CI pulls it first: .ci/run; elsewhere the
test is skipped unless it is pulled, tests.hfmodels.real_model): `models list` shows the
import, examples/smollm2-arithmetic.toml runs two small RL cycles on the embedded server, the
run exports, and the adapter loads offline with AutoPeftModelForCausalLM, moved off zero."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from flows.cli.main import main
from flows.core.config import settings_with_overrides, validated
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from tests.hfmodels.real_model import PULLED, REPO_ID, real_model_snapshot
from whitney import hf_cache
from whitney.local import EmbeddedWhitney

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "smollm2-arithmetic.toml"
SMALL = {
    "cycles": 2,
    "prompts_per_cycle": 2,
    "group_size": 2,
    "max_tokens": 4,
    "eval_every": 0,
    "eval_at_start": False,
}
"""Two cycles of 2 prompts x 2 samples x 4 tokens: seconds, not minutes."""


@pytest.mark.filterwarnings("ignore::FutureWarning")  # PEFT calls a deprecated API
def test_import_rl_export_and_peft_load_on_the_real_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from peft import AutoPeftModelForCausalLM

    snapshot = real_model_snapshot()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["models", "list"]) == 0
    listed = capsys.readouterr().out
    assert f"{REPO_ID}  llama" in listed and PULLED.sha256[:12] in listed
    with EmbeddedWhitney(hf_cache=hf_cache.cache_dir(), session_ttl_s=0) as server:
        monkeypatch.setenv("WHITNEY_API_KEY", server.api_key)
        monkeypatch.delenv("WHITNEY_API_URL", raising=False)
        settings = settings_with_overrides(EXAMPLE, {**SMALL, "api_url": server.url})
        config = validated(RLConfig, settings)
        assert config.base_model == REPO_ID
        result = rl_flow(config)
        assert [cycle.cycle for cycle in result.cycles] == [0, 1]
        out = tmp_path / "adapter"
        assert main(["export", result.run_id, "--out", str(out), "--api-url", server.url]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = AutoPeftModelForCausalLM.from_pretrained(out)
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
    assert lora_b and any(torch.count_nonzero(p) > 0 for p in lora_b)  # two steps moved it
    template = (snapshot / "chat_template.jinja").read_text()
    assert (out / "chat_template.jinja").read_text() == template
