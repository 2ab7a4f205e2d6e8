"""The eight losses over HTTP: each `forward` loss against an independent computation of the
losses.md formula, written here in plain Python (float64) from the per-token `logprobs` (or
critic `values`) the server returns. Ratios are placed on both sides of every clip bound and
advantages take both signs, so each branch of each formula is exercised."""

from __future__ import annotations

import itertools
import math

import pytest

from .helpers import datum, forward, http, new_run, run_op

PROMPT = [72, 101, 108]
COMPLETION = [108, 111, 32, 119, 111, 114]
N = len(COMPLETION)
PAD = len(PROMPT) - 1
# token ratios r = exp(lp - q) placed around the clip bounds of ppo (0.8/1.2), cispo (0/4)
RATIOS = [0.5, 0.9, 1.0, 1.1, 1.5, 5.0]
ADVANTAGES = [1.0, -1.0, 0.5, -2.0, 1.5, -0.5]


def approx(value: float) -> pytest.approx:
    return pytest.approx(value, rel=2e-5, abs=2e-5)


class Policy:
    """A policy run and a helper that answers (loss, metrics, per-datum completion lp)."""

    def __init__(self, client, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.seq = itertools.count(1)

    def forward(self, data: list[dict], loss: str, config: dict | None = None) -> dict:
        op = run_op(
            self.client, self.run_id, next(self.seq), "forward", forward(data, loss, config)
        )
        return op["result"]

    def base_lp(self) -> list[float]:
        """The learner's completion logprobs (they do not change: `forward` never trains)."""
        out = self.forward([datum(PROMPT, COMPLETION)], "cross_entropy")
        return out["outputs"][0]["logprobs"][PAD:]


@pytest.fixture(scope="module")
def policy(embedded_server):
    with http(embedded_server) as client:
        run = new_run(client, base_model="local/nano", seed=11)
        yield Policy(client, run["run_id"])


def completion_lp(result: dict, index: int = 0) -> list[float]:
    lp = result["outputs"][index]["logprobs"]
    assert len(lp) == len(PROMPT) + N - 1
    return lp[PAD:]


def sampler_logprobs(lp: list[float], ratios: list[float]) -> list[float]:
    """q such that exp(lp - q) = ratio."""
    return [value - math.log(r) for value, r in zip(lp, ratios, strict=True)]


def clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def ratio(lp: float, q: float) -> float:
    return math.exp(clip(lp - q, -20.0, 20.0))


def check_common(result: dict, expected: float, weight_sum: float = N) -> None:
    assert result["loss"] == approx(expected)
    assert result["metrics"]["loss:sum"] == approx(expected)
    assert result["metrics"]["tokens:sum"] == approx(weight_sum)


def test_cross_entropy(policy):
    result = policy.forward([datum(PROMPT, COMPLETION)], "cross_entropy")
    lp = completion_lp(result)
    check_common(result, sum(-x for x in lp))
    # without `weights`, every position counts
    unweighted = datum(PROMPT, COMPLETION)
    del unweighted["loss_inputs"]["weights"]
    result = policy.forward([unweighted], "cross_entropy")
    full = result["outputs"][0]["logprobs"]
    assert result["loss"] == approx(sum(-x for x in full))


def two_datums(lp: list[float], ratios: list[float], **extra) -> list[dict]:
    """The same completion twice, with opposite advantages: every sign meets every ratio."""
    q = sampler_logprobs(lp, ratios)
    return [
        datum(PROMPT, COMPLETION, logprobs=q, advantages=ADVANTAGES, **extra),
        datum(PROMPT, COMPLETION, logprobs=q, advantages=[-a for a in ADVANTAGES], **extra),
    ]


def per_token(result: dict, data: list[dict]):
    """(lp, q, A, w) per completion token of every datum, from the answer and the request."""
    for index, d in enumerate(data):
        lp = completion_lp(result, index)
        inputs = d["loss_inputs"]
        q = inputs["logprobs"]["values"][PAD:]
        A = inputs["advantages"]["values"][PAD:]
        w = inputs["weights"]["values"][PAD:]
        yield index, lp, q, A, w


def weighted_sums(result: dict, data: list[dict], term) -> tuple[float, float, float]:
    """Over every completion token t of every datum, with `term(t, lp, q, A)` giving the
    token's (loss term, metric term): the sums of w * loss term, of w * metric term, and of w."""
    loss, metric, weight = 0.0, 0.0, 0.0
    for _, lp, q, A, w in per_token(result, data):
        for t in range(N):
            loss_term, metric_term = term(t, lp[t], q[t], A[t])
            loss += w[t] * loss_term
            metric += w[t] * metric_term
            weight += w[t]
    return loss, metric, weight


def test_importance_sampling(policy):
    data = two_datums(policy.base_lp(), RATIOS)
    result = policy.forward(data, "importance_sampling")
    expected, kl, weight = weighted_sums(
        result, data, lambda t, lp, q, A: (-ratio(lp, q) * A, q - lp)
    )
    check_common(result, expected, 2 * N)
    assert result["metrics"]["kl_sample_train:mean"] == approx(kl / weight)


def ppo_expected(result, data, lo_default, hi_default, lo_tensor=None, hi_tensor=None):
    def term(t, lp, q, A):
        lo = lo_tensor[t] if lo_tensor else lo_default
        hi = hi_tensor[t] if hi_tensor else hi_default
        r = ratio(lp, q)
        return -min(r * A, clip(r, lo, hi) * A), r < lo or r > hi

    loss, clipped, weight = weighted_sums(result, data, term)
    return loss, clipped / weight


@pytest.mark.parametrize("config", [{}, {"clip_low_threshold": 0.95, "clip_high_threshold": 1.05}])
def test_ppo_clipping_branches(policy, config):
    data = two_datums(policy.base_lp(), RATIOS)
    result = policy.forward(data, "ppo", config)
    expected, fraction = ppo_expected(
        result,
        data,
        config.get("clip_low_threshold", 0.8),
        config.get("clip_high_threshold", 1.2),
    )
    check_common(result, expected, 2 * N)
    assert result["metrics"]["clip_fraction:mean"] == approx(fraction)
    assert 0 < fraction < 1
    # the clipped branch really differs from plain importance sampling
    plain = policy.forward(data, "importance_sampling")
    assert abs(plain["loss"] - result["loss"]) > 1e-3


def test_ppo_per_token_clip_tensors_override_the_scalars(policy):
    lo_tensor = [0.4, 0.95, 0.8, 0.8, 0.6, 0.8]
    hi_tensor = [1.2, 1.05, 1.2, 1.05, 2.0, 6.0]
    data = two_datums(
        policy.base_lp(), RATIOS, clip_low_threshold=lo_tensor, clip_high_threshold=hi_tensor
    )
    config = {"clip_low_threshold": 0.99, "clip_high_threshold": 1.01}
    result = policy.forward(data, "ppo", config)
    expected, fraction = ppo_expected(result, data, 0.99, 1.01, lo_tensor, hi_tensor)
    check_common(result, expected, 2 * N)
    assert result["metrics"]["clip_fraction:mean"] == approx(fraction)


@pytest.mark.parametrize("config", [{}, {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}])
def test_cispo(policy, config):
    data = two_datums(policy.base_lp(), RATIOS)
    result = policy.forward(data, "cispo", config)
    lo = config.get("clip_low_threshold", 0.0)
    hi = config.get("clip_high_threshold", 4.0)

    def term(t, lp, q, A):
        r = ratio(lp, q)
        return -clip(r, lo, hi) * A * lp, r < lo or r > hi

    expected, clipped, weight = weighted_sums(result, data, term)
    check_common(result, expected, 2 * N)
    assert result["metrics"]["clip_fraction:mean"] == approx(clipped / weight)
    assert clipped > 0  # the 5.0 ratio is clipped at 4 by default


@pytest.mark.parametrize("config", [{}, {"beta": 0.7}])
def test_dro_quadratic_term(policy, config):
    data = two_datums(policy.base_lp(), RATIOS)
    result = policy.forward(data, "dro", config)
    beta = config.get("beta", 0.05)

    def term(t, lp, q, A):
        return -(lp * A - 0.5 * beta * (lp - q) ** 2), 0.5 * beta * (lp - q) ** 2

    expected, quadratic, _ = weighted_sums(result, data, term)
    check_common(result, expected, 2 * N)
    assert quadratic > 1e-3  # the quadratic term matters in this case


@pytest.mark.parametrize(
    ("ratios", "mask"),
    [
        ([1.5, 1.6, 1.4, 1.5, 1.7, 1.3], None),  # sequence ratio above 1.2: clipped for A > 0
        ([0.6, 0.7, 0.5, 0.6, 0.8, 0.6], None),  # below 0.8
        ([1.05, 1.0, 0.95, 1.1, 1.0, 1.02], None),  # inside the band
        ([3.0, 3.0, 1.0, 1.0, 1.0, 1.0], [1, 1, 0, 0, 0, 0]),  # mask: only the first two
    ],
)
def test_gspo_sequence_ratio(policy, ratios, mask):
    extra = {} if mask is None else {"sequence_ratio_mask": [float(m) for m in mask]}
    data = two_datums(policy.base_lp(), ratios, **extra)
    result = policy.forward(data, "gspo")
    expected, clipped, weight = 0.0, 0.0, 0.0
    for _index, lp, q, A, w in per_token(result, data):
        token_mask = mask if mask is not None else [1.0 if x != 0 else 0.0 for x in w]
        log_s = sum((lp[t] - q[t]) * token_mask[t] for t in range(N)) / sum(token_mask)
        s = math.exp(log_s)
        for t in range(N):
            expected += w[t] * -min(s * A[t], clip(s, 0.8, 1.2) * A[t])
            clipped += w[t] * (s < 0.8 or s > 1.2)
            weight += w[t]
        if mask is not None:
            assert s == pytest.approx(3.0, rel=1e-4)
    check_common(result, expected, 2 * N)
    assert result["metrics"]["clip_fraction:mean"] == approx(clipped / weight)


@pytest.mark.parametrize(
    ("mu", "config"),
    [
        # mu - p > delta_low with A < 0 masks; p - mu > delta_high with A > 0 masks
        ([0.5, 0.5, 1e-6, 0.3, 1e-6, 0.5], {}),
        ([1e-9, 1e-9, 0.5, 0.25, 1e-9, 0.01], {"delta_low": 0.1, "delta_high": 0.001}),
    ],
)
def test_dppo_masking(policy, mu, config):
    q = [math.log(m) for m in mu]
    data = [
        datum(PROMPT, COMPLETION, logprobs=q, advantages=ADVANTAGES),
        datum(PROMPT, COMPLETION, logprobs=q, advantages=[-a for a in ADVANTAGES]),
    ]
    result = policy.forward(data, "dppo", config)
    delta_low = config.get("delta_low", 0.2)
    delta_high = config.get("delta_high", 0.2)

    def term(t, lp, q, A):
        p, m_u = math.exp(lp), math.exp(q)
        assert abs(p - m_u - delta_high) > 1e-4 and abs(m_u - p - delta_low) > 1e-4
        outside = (A > 0 and p - m_u > delta_high) or (A < 0 and m_u - p > delta_low)
        m = 0.0 if outside else 1.0
        return -ratio(lp, q) * A * m, 1 - m

    expected, masked, weight = weighted_sums(result, data, term)
    check_common(result, expected, 2 * N)
    assert result["metrics"]["masked_fraction:mean"] == approx(masked / weight)
    assert 0 < masked < weight


def test_ppo_critic_value_clipping(embedded_server):
    with http(embedded_server) as client:
        run_id = new_run(client, role="critic", provider="modal", seed=5)["run_id"]
        seq = itertools.count(1)

        def critic_forward(data, loss="ppo_critic", config=None):
            return run_op(client, run_id, next(seq), "forward", forward(data, loss, config))

        zeros = [0.0] * N
        probe = critic_forward([datum(PROMPT, COMPLETION, values=zeros, returns=zeros)])
        assert "values" in probe["result"]["outputs"][0]
        v = probe["result"]["outputs"][0]["values"][PAD:]
        # V_t - V_old = -offset: beyond +-c (clipped) and within it; R on either side
        offsets = [0.5, -0.5, 0.1, -0.1, 0.3, 0.0]
        returns_shift = [1.0, -1.0, 0.2, 0.05, -0.4, 0.3]
        v_old = [a + b for a, b in zip(v, offsets, strict=True)]
        returns = [a + b for a, b in zip(v, returns_shift, strict=True)]
        second = [x * 0.5 for x in returns_shift]
        data = [
            datum(PROMPT, COMPLETION, values=v_old, returns=returns),
            datum(
                PROMPT,
                COMPLETION,
                values=v_old,
                returns=[a + b for a, b in zip(v, second, strict=True)],
            ),
        ]
        for loss, config in (("ppo_critic", {}), ("ppo_critic", {"value_clip": 0.35}), ("ppo", {})):
            result = critic_forward(data, loss, config)["result"]
            c = config.get("value_clip", 0.2)
            per_datum, clipped, weight = [], 0.0, 0.0
            for index, d in enumerate(data):
                values = result["outputs"][index]["values"][PAD:]
                old = d["loss_inputs"]["values"]["values"][PAD:]
                R = d["loss_inputs"]["returns"]["values"][PAD:]
                w = d["loss_inputs"]["weights"]["values"][PAD:]
                total = 0.0
                for t in range(N):
                    vc = old[t] + clip(values[t] - old[t], -c, c)
                    total += w[t] * max((vc - R[t]) ** 2, (values[t] - R[t]) ** 2)
                    clipped += w[t] * (abs(values[t] - old[t]) > c)
                    weight += w[t]
                per_datum.append(total / sum(w))
            expected = 0.5 * sum(per_datum) / len(per_datum)
            assert result["loss"] == approx(expected), (loss, config)
            assert result["metrics"]["values_clipfrac:mean"] == approx(clipped / weight)
            assert 0 < clipped < weight


# --------------------------------------------------------------------------- gradients
#
# For any of these losses, dL/dtheta = sum_t c_t * dlp_t/dtheta with c_t = dL/dlp_t. The test
# computes c_t from the docs/losses.md formula (by hand, below) and builds a cross_entropy datum
# with weights -c_t: its gradient is the same by the chain rule. Two runs with the same seed
# (the same initial weights) take one forward_backward each, the loss's and the surrogate's:
# `optim_step` must report the same pre-clip grad_norm, and the adapters after the step must
# give the same logprobs.


def coefficients(loss: str, lp, q, A, w, config) -> list[float]:
    """dL/dlp_t for one datum's completion tokens."""
    r = [ratio(a, b) for a, b in zip(lp, q, strict=True)]
    if loss == "importance_sampling":
        return [-w[t] * A[t] * r[t] for t in range(N)]
    if loss == "ppo":
        lo = config.get("clip_low_threshold", 0.8)
        hi = config.get("clip_high_threshold", 1.2)
        return [
            -w[t] * A[t] * r[t] if r[t] * A[t] <= clip(r[t], lo, hi) * A[t] else 0.0
            for t in range(N)
        ]
    if loss == "cispo":
        lo = config.get("clip_low_threshold", 0.0)
        hi = config.get("clip_high_threshold", 4.0)
        return [-w[t] * clip(r[t], lo, hi) * A[t] for t in range(N)]
    if loss == "dro":
        beta = config.get("beta", 0.05)
        return [-w[t] * (A[t] - beta * (lp[t] - q[t])) for t in range(N)]
    if loss == "gspo":
        s = math.exp(sum(lp[t] - q[t] for t in range(N) if w[t]) / sum(1 for x in w if x))
        return [-w[t] * A[t] * s if s * A[t] <= clip(s, 0.8, 1.2) * A[t] else 0.0 for t in range(N)]
    if loss == "dppo":
        lo, hi = config.get("delta_low", 0.2), config.get("delta_high", 0.2)
        out = []
        for t in range(N):
            p, mu = math.exp(lp[t]), math.exp(q[t])
            masked = (A[t] > 0 and p - mu > hi) or (A[t] < 0 and mu - p > lo)
            out.append(0.0 if masked else -w[t] * A[t] * r[t])
        return out
    raise AssertionError(loss)


def surrogate(data: list[dict], coefficients_per_datum: list[list[float]]) -> dict:
    out = []
    for d, c in zip(data, coefficients_per_datum, strict=True):
        weights = [0.0] * PAD + [-x for x in c]
        out.append(
            {
                "input": d["input"],
                "loss_inputs": {
                    "target_tokens": d["loss_inputs"]["target_tokens"],
                    "weights": {"dtype": "float32", "shape": [len(weights)], "values": weights},
                },
            }
        )
    return forward(out, "cross_entropy")


def one_step(client, seed: int, payload: dict, role: str = "policy") -> tuple[float, dict, list]:
    """A fresh run: forward_backward(payload), optim_step; (grad_norm, fb result, logprobs
    after the step)."""
    provider = "modal" if role == "critic" else "local"
    run_id = new_run(client, seed=seed, role=role, provider=provider)["run_id"]
    fb = run_op(client, run_id, 1, "forward_backward", payload)["result"]
    step = run_op(client, run_id, 2, "optim_step", {"optimizer": {"learning_rate": 1e-3}})
    grad_norm = step["result"]["metrics"]["grad_norm"]
    if role == "critic":
        after = run_op(client, run_id, 3, "forward", payload)["result"]["outputs"]
        return grad_norm, fb, [o["values"] for o in after]
    run_op(client, run_id, 3, "save_weights_for_sampler", {"name": "s"})
    probe = {"sequences": [{"token_ids": PROMPT + COMPLETION}]}
    return grad_norm, fb, run_op(client, run_id, 4, "logprobs", probe, "s")["result"]["logprobs"]


@pytest.mark.parametrize(
    ("loss", "ratios", "config"),
    [
        ("importance_sampling", RATIOS, {}),
        ("ppo", RATIOS, {}),
        ("cispo", RATIOS, {"clip_high_threshold": 1.3}),
        ("dro", RATIOS, {"beta": 0.5}),
        ("gspo", [1.5, 1.6, 1.4, 1.5, 1.7, 1.3], {}),
        ("dppo", [1.0, 0.5, 1.0, 1.0, 2.0, 1.0], {"delta_low": 0.001, "delta_high": 0.2}),
    ],
)
def test_gradients_match_the_chain_rule(embedded_server, policy, loss, ratios, config):
    # one datum: two with opposite advantages would cancel each other's gradient
    data = two_datums(policy.base_lp(), ratios)[:1]
    with http(embedded_server) as client:
        grad_norm, fb, after = one_step(client, 11, forward(data, loss, config))
        per_datum = [
            coefficients(loss, lp, q, A, w, config) for _, lp, q, A, w in per_token(fb, data)
        ]
        assert any(c != 0 for cs in per_datum for c in cs)
        expected_norm, _, expected_after = one_step(client, 11, surrogate(data, per_datum))
    assert grad_norm == pytest.approx(expected_norm, rel=1e-4)
    assert grad_norm > 1e-3
    for got, want in zip(after[0][1:], expected_after[0][1:], strict=True):
        assert got == pytest.approx(want, abs=1e-4)


def test_critic_gradient_matches_an_unclipped_surrogate(embedded_server):
    """dL/dV_t of the clipped value loss, from the formula; the surrogate is the same loss
    without clipping and with returns R' = V - g/2, whose gradient is the same."""
    with http(embedded_server) as client:
        probe_run = new_run(client, seed=5, role="critic", provider="modal")["run_id"]
        zeros = [0.0] * N
        probe = run_op(
            client,
            probe_run,
            1,
            "forward",
            forward([datum(PROMPT, COMPLETION, values=zeros, returns=zeros)], "ppo_critic"),
        )
        v = probe["result"]["outputs"][0]["values"][PAD:]
        v_old = [a + b for a, b in zip(v, [0.5, -0.5, 0.1, -0.1, 0.3, 0.0], strict=True)]
        returns = [a + b for a, b in zip(v, [1.0, -1.0, 0.2, 0.05, -0.4, 0.3], strict=True)]
        c = 0.2
        payload = forward([datum(PROMPT, COMPLETION, values=v_old, returns=returns)], "ppo_critic")
        grad_norm, fb, after = one_step(client, 5, payload, role="critic")
        values = fb["outputs"][0]["values"][PAD:]
        g = []
        for t in range(N):
            vc = v_old[t] + clip(values[t] - v_old[t], -c, c)
            clipped_active = abs(values[t] - v_old[t]) > c
            if (values[t] - returns[t]) ** 2 >= (vc - returns[t]) ** 2:
                g.append(2 * (values[t] - returns[t]))
            else:  # the clipped branch: no gradient where the clip is active
                g.append(0.0 if clipped_active else 2 * (vc - returns[t]))
        assert any(x == 0.0 for x in g) and any(x != 0.0 for x in g)
        target = [values[t] - g[t] / 2 for t in range(N)]
        unclipped = forward(
            [datum(PROMPT, COMPLETION, values=v_old, returns=target)],
            "ppo_critic",
            {"value_clip": 1e6},
        )
        expected_norm, _, expected_after = one_step(client, 5, unclipped, role="critic")
    assert grad_norm == pytest.approx(expected_norm, rel=1e-4)
    for got, want in zip(after[0], expected_after[0], strict=True):
        assert got == pytest.approx(want, abs=1e-4)
