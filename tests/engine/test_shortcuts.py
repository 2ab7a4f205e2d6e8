"""Work the engine reuses or skips changes no bit it returns: the trainer's merged weights,
reused until the adapter changes, give the numbers a fresh build gives (the sampler's, built
from a snapshot of the same adapter), and stale ones are never used after an optim_step or a
load_state; a sampler and the trainer share one build of a weights version, the bits of a
build of the sampler's own; the target logprobs computed over chunks of positions are the
bits of the whole log-softmax gathered, and so are their gradients where the logits are kept
for the backward (recomputed chunk by chunk, the gradients go through float32 BLAS on other
shapes: close); positions whose gradient is 0 get no backward through the vocabulary."""

from __future__ import annotations

import pytest
import torch

from whitney.local.engine import EngineRun, exact, losses, model, runtime

from .helpers import datum, make_sequences, train_a_little


def forward_logprobs(run: EngineRun, sequences: list[list[int]]) -> list[list[float]]:
    data = [datum(s[:-1], s[1:]) for s in sequences]
    result = run.forward({"data": data, "loss_function": "cross_entropy"}, backward=False).result
    return [out["logprobs"] for out in result["outputs"]]


def sampler_logprobs(run: EngineRun, sampler: str, sequences: list[list[int]]) -> list[list]:
    body = {"sequences": [{"token_ids": s} for s in sequences]}
    return [row[1:] for row in run.logprobs(sampler, body).result["logprobs"]]


def test_reused_trainer_weights_are_those_of_the_current_adapter(tmp_path) -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=5)
    sequences = make_sequences(7, 5)
    train_a_little(run, steps=1)
    run.save_state(tmp_path / "one")
    first = forward_logprobs(run, sequences)
    assert forward_logprobs(run, sequences) == first  # reused
    run.save_weights_for_sampler("one")
    assert sampler_logprobs(run, "one", sequences) == first  # a fresh build's bits
    train_a_little(run, steps=1)  # built at the old version during its forward_backward
    second = forward_logprobs(run, sequences)
    assert second != first
    run.save_weights_for_sampler("two")
    assert sampler_logprobs(run, "two", sequences) == second
    run.load_state(tmp_path / "one")
    assert forward_logprobs(run, sequences) == first


def test_a_sampler_and_the_trainer_share_one_build_of_their_weights_version() -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=5)
    sequences = make_sequences(7, 5)
    train_a_little(run, steps=1)
    trained = forward_logprobs(run, sequences)  # the trainer builds this version's layers first
    run.save_weights_for_sampler("after")
    assert sampler_logprobs(run, "after", sequences) == trained
    assert run.sampler_model("after").frozen[0].fixed["qkv"] is run.layers()[0].fixed["qkv"]
    assert run.sampler_model("after").head is run.model.head
    train_a_little(run, steps=1)
    run.save_weights_for_sampler("before")
    sampled = sampler_logprobs(run, "before", sequences)  # the sampler builds this one first
    assert run.layers()[0].fixed["qkv"] is run.sampler_model("before").frozen[0].fixed["qkv"]
    assert forward_logprobs(run, sequences) == sampled
    for sampler in ("after", "before"):  # the bits of a build from the snapshot alone
        snapshot = run.snapshots[run.samplers[sampler]]
        own = model.Llama(run.cfg, snapshot.merged(run.base_weights)).layer_weights()
        for shared, built in zip(run.sampler_model(sampler).frozen, own, strict=True):
            assert all(torch.equal(shared.fixed[g], built.fixed[g]) for g in built.fixed)
            assert torch.equal(shared.value_grid, built.value_grid)
    assert torch.equal(run.model.head, exact.weight(run.base_weights["lm_head.weight"]))


def head_inputs() -> tuple[EngineRun, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A trained nano run, hidden states of 3 x 11 positions (a leaf), targets, and upstream
    gradients for the head."""
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=5)
    train_a_little(run, steps=1)
    ids = torch.randint(0, 258, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden = run.model.hidden(ids[:, :-1])
    upstream = torch.randn(ids[:, 1:].shape, generator=torch.Generator().manual_seed(2))
    return run, hidden.requires_grad_(), ids[:, 1:], upstream


def value_and_grad(out: torch.Tensor, hidden: torch.Tensor, upstream: torch.Tensor):
    """`out` and its gradient to `hidden` for the upstream gradient `upstream`."""
    (grad,) = torch.autograd.grad(out, hidden, upstream)
    return out, grad


def head_chunks(monkeypatch, chunk: int, saved: int) -> None:
    """TargetLogprobs' chunks of `chunk` logits, keeping up to `saved` for the backward."""
    monkeypatch.setattr(model, "LOGITS_CHUNK", chunk)
    monkeypatch.setattr(model, "SAVED_LOGITS", saved)


@pytest.mark.parametrize(
    ("chunk", "saved"), [(model.LOGITS_CHUNK, model.SAVED_LOGITS), (600, 10**9), (600, 0), (1, 0)]
)
def test_target_logprobs_are_the_whole_log_softmax_gathered(monkeypatch, chunk, saved) -> None:
    run, hidden, targets, upstream = head_inputs()
    logprobs = exact.log_softmax(run.model.logits(hidden))
    want, want_grad = value_and_grad(
        logprobs.gather(-1, targets[..., None])[..., 0], hidden, upstream
    )
    head_chunks(monkeypatch, chunk, saved)
    got, got_grad = value_and_grad(run.model.target_logprobs(hidden, targets), hidden, upstream)
    assert torch.equal(got, want)
    if saved:
        assert torch.equal(got_grad, want_grad)
    else:
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        assert torch.equal(run.model.target_logprobs(hidden, targets), want)


@pytest.mark.parametrize(
    ("chunk", "saved"), [(model.LOGITS_CHUNK, model.SAVED_LOGITS), (600, 0), (1, 0)]
)
def test_positions_without_a_gradient_are_skipped_and_change_nothing(
    monkeypatch, chunk, saved
) -> None:
    """An RL datum's prompt weighs 0: its positions get no backward through the vocabulary,
    their gradient is exactly 0, the others' that of the whole log-softmax gathered."""
    run, hidden, targets, upstream = head_inputs()
    upstream[:, :6] = 0.0  # the prompts
    upstream[1] = 0.0  # a datum weighing nothing
    logprobs = exact.log_softmax(hidden @ run.base_weights["lm_head.weight"].t())
    _, want_grad = value_and_grad(logprobs.gather(-1, targets[..., None])[..., 0], hidden, upstream)
    head_chunks(monkeypatch, chunk, saved)
    got, got_grad = value_and_grad(run.model.target_logprobs(hidden, targets), hidden, upstream)
    assert torch.equal(got, run.model.target_logprobs(hidden.detach(), targets))
    assert not got_grad[upstream == 0].any()
    assert got_grad[upstream != 0].abs().min() > 0
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-7)


def trained_outputs_and_grads(run: EngineRun, sequences: list[list[int]]):
    for p in run.trainable_parameters().values():
        p.grad = None
    data = [datum(s[:-1], s[1:]) for s in sequences]
    result = run.forward({"data": data, "loss_function": "cross_entropy"}, backward=True).result
    grads = {n: p.grad.clone() for n, p in run.trainable_parameters().items()}
    return result, grads


def test_recomputed_layers_give_the_same_outputs_and_gradients(monkeypatch) -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=5)
    train_a_little(run, steps=1)
    sequences = make_sequences(11, 6, lengths=(5, 40))
    kept, kept_grads = trained_outputs_and_grads(run, sequences)
    monkeypatch.setattr(runtime, "SAVED_ACTIVATIONS", 0)
    recomputed, recomputed_grads = trained_outputs_and_grads(run, sequences)
    assert recomputed == kept
    assert recomputed_grads.keys() == kept_grads.keys()
    assert all(torch.equal(recomputed_grads[n], g) for n, g in kept_grads.items())


def test_a_token_budget_per_forward_changes_no_output(monkeypatch) -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=5)
    train_a_little(run, steps=1)
    sequences = make_sequences(12, 7, lengths=(5, 40))
    whole, whole_grads = trained_outputs_and_grads(run, sequences)
    monkeypatch.setattr(runtime, "CHUNK_TOKENS", 50)  # one or two datums per forward
    assert len(runtime.forward_chunks(list(range(7)), [len(s) - 1 for s in sequences])) > 3
    split, split_grads = trained_outputs_and_grads(run, sequences)
    assert split == whole
    for name, grad in whole_grads.items():  # float32 BLAS on other shapes: close
        torch.testing.assert_close(split_grads[name], grad, rtol=1e-3, atol=1e-5)


def loss_inputs(rows: int, width: int) -> dict[str, torch.Tensor]:
    """Every input any loss reads, right-padded, some datums without the optional tensors."""
    g = torch.Generator().manual_seed(4)
    lengths = torch.randint(2, width + 1, (rows,), generator=g)
    valid = torch.arange(width)[None, :] < lengths[:, None]

    def padded(values: torch.Tensor) -> torch.Tensor:
        return torch.where(valid, values, 0.0)

    lacking = torch.where(valid, torch.nan, 0.0)
    inputs = {
        "weights": padded((torch.rand(rows, width, generator=g) > 0.3).float()),
        "advantages": padded(torch.randn(rows, width, generator=g)),
        "logprobs": padded(-3 * torch.rand(rows, width, generator=g)),
        "values": padded(torch.randn(rows, width, generator=g)),
        "returns": padded(torch.randn(rows, width, generator=g)),
        "clip_low_threshold": padded(torch.full((rows, width), 0.7)),
        "sequence_ratio_mask": padded((torch.rand(rows, width, generator=g) > 0.5).float()),
    }
    for name in ("clip_low_threshold", "sequence_ratio_mask"):
        inputs[name][::2] = lacking[::2]
    return inputs


@pytest.mark.parametrize("loss", [*losses.POLICY, "ppo_critic"])
def test_a_loss_gradient_at_a_datum_is_the_same_whatever_its_batch_mates_hold(loss) -> None:
    """What lets forward_backward take each chunk's gradients alone: a loss is a sum over datums
    of terms of the datum's own row, so its gradient there ignores the other rows."""
    function = losses.ppo_critic if loss == "ppo_critic" else losses.POLICY[loss]
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "beta": 0.1}
    config |= {"delta_low": 0.2, "delta_high": 0.2, "value_clip": 0.2}
    inputs = loss_inputs(6, 9)
    g = torch.Generator().manual_seed(5)
    outputs = torch.where(inputs["weights"] != 0, -3 * torch.rand(6, 9, generator=g), 0.0)
    rows = torch.tensor([1, 4])

    def gradient(others: torch.Tensor) -> torch.Tensor:
        mine = outputs[rows].clone().requires_grad_()
        value, _ = function(others.index_put((rows,), mine), inputs, config)
        (grad,) = torch.autograd.grad(value, mine)
        return grad

    whole = gradient(outputs)
    assert whole.abs().sum() > 0
    assert torch.equal(gradient(torch.zeros_like(outputs)), whole)
    assert torch.equal(gradient(-10 * torch.rand(6, 9, generator=g)), whole)


def test_target_logprobs_check_between_chunks(monkeypatch) -> None:
    """A long head (many chunks) stops at the next chunk once its check raises."""
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=5)
    ids = torch.randint(0, 258, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hidden = run.model.hidden(ids[:, :-1])
    monkeypatch.setattr(model, "LOGITS_CHUNK", 1)
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise InterruptedError

    with pytest.raises(InterruptedError), torch.no_grad():
        run.model.target_logprobs(hidden, ids[:, 1:], check)
    assert len(calls) == 3


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention in float64, grouped-query heads repeated: the reference."""
    groups = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("chunk", [model.ATTENTION_CHUNK, 200, 1])
def test_attention_over_chunks_of_queries_is_softmax_attention(monkeypatch, chunk) -> None:
    """Any chunking of the queries gives the bits of one chunk; value and gradients are those of
    plain softmax attention (float64, written here) to float32 precision."""
    cfg = model.ModelConfig(
        hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64
    )
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(3, h, 9, 16, generator=gen) for h in (4, 2, 2))
    grid = torch.full((2, 1, 16), 2.0**-16, dtype=torch.float64)
    positions = torch.arange(9).expand(3, -1)
    upstream = torch.randn(3, 4, 9, 16, generator=gen)

    def attend() -> tuple[torch.Tensor, ...]:
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = model.Attention.apply(
            *inputs,
            model.KeyValues.of(k, v, grid),
            list(model.query_chunks(positions, positions, 4)),
            cfg.prob_bits,
            model.no_check,
        )
        return out, *torch.autograd.grad(out, inputs, upstream)

    whole = attend()
    monkeypatch.setattr(model, "ATTENTION_CHUNK", chunk)
    chunked = attend()
    assert torch.equal(chunked[0], whole[0])
    inputs = [t.double().requires_grad_() for t in (q, k, v)]
    want = plain_attention(*inputs)
    want_grads = torch.autograd.grad(want, inputs, upstream.double())
    torch.testing.assert_close(chunked[0].double(), want, rtol=1e-5, atol=1e-5)
    for got, expected in zip(chunked[1:], want_grads, strict=True):
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("setting", "value"), [("ATTENTION_CHUNK", 100), ("CAUSAL_ROWS", 4)])
def test_chunked_attention_changes_no_output_of_training_or_sampling(
    monkeypatch, setting, value
) -> None:
    """Chunks of queries that fit (ATTENTION_CHUNK) or skip keys no query sees (CAUSAL_ROWS)."""
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=5)
    train_a_little(run, steps=1)
    run.save_weights_for_sampler("s")
    sequences = make_sequences(13, 5, lengths=(5, 40))
    params = {"max_tokens": 12, "temperature": 1.0, "seed": 3}
    request = [
        {"prompt": {"token_ids": sequences[0][:20]}, "num_samples": 3, "sampling_params": params}
    ]
    whole, whole_grads = trained_outputs_and_grads(run, sequences)
    sampled = run.sample("s", request, [0])[0].result
    monkeypatch.setattr(model, setting, value)
    split, split_grads = trained_outputs_and_grads(run, sequences)
    assert split == whole
    assert run.sample("s", request, [0])[0].result == sampled
    for name, grad in whole_grads.items():  # float32 sums over chunks in another order: close
        torch.testing.assert_close(split_grads[name], grad, rtol=1e-3, atol=1e-5)
