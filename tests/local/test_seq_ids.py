"""Seq ids are strict JSON integers in 1..2^63-1, in a body, a path or a query: anything else
is a 400 naming the field, answered before anything is journaled, so `next_seq_id` does not
move and the id stays free for a corrected resend."""

from __future__ import annotations

import httpx
import pytest

from .helpers import assert_error, new_run, post_op

TOO_BIG = 2**63


@pytest.mark.parametrize(
    ("seq_id", "message"),
    [
        ("1", "valid integer"),
        (1.0, "valid integer"),
        (True, "valid integer"),
        (None, "valid integer"),
        (0, "greater than or equal to 1"),
        (-5, "greater than or equal to 1"),
        (TOO_BIG, "less than 9223372036854775808"),
        (2**70, "less than 9223372036854775808"),
    ],
)
def test_a_seq_id_that_is_not_a_small_positive_integer_is_refused(
    api: httpx.Client, seq_id: object, message: str
) -> None:
    run = new_run(api)
    response = post_op(api, run["run_id"], seq_id, "save_state", {})  # type: ignore[arg-type]
    error = assert_error(response, 400, "invalid_request", "seq_id", message)
    assert error["details"]["field"] == "seq_id"
    after = api.get(f"/v1/training/runs/{run['run_id']}").json()
    assert after["next_seq_id"] == run["next_seq_id"] == 1
    assert api.get(f"/v1/training/runs/{run['run_id']}/operations").json()["operations"] == []
    corrected = post_op(api, run["run_id"], 1, "save_state", {})
    assert corrected.status_code == 200 and corrected.json()["seq_id"] == 1


def test_the_largest_seq_id_is_a_valid_one(api: httpx.Client) -> None:
    run_id = new_run(api)["run_id"]
    response = api.get(f"/v1/training/runs/{run_id}/operations/{TOO_BIG - 1}")
    assert_error(response, 404, "not_found", str(TOO_BIG - 1))


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("operations/{too_big}", "seq_id"),
        ("operations/{huge}", "seq_id"),
        ("operations/0", "seq_id"),
        ("operations?after_seq={too_big}", "after_seq"),
        ("operations?after_seq=-1", "after_seq"),
    ],
)
def test_a_seq_id_out_of_range_in_a_path_or_query_is_a_400(
    api: httpx.Client, path: str, field: str
) -> None:
    run_id = new_run(api)["run_id"]
    url = f"/v1/training/runs/{run_id}/" + path.format(too_big=TOO_BIG, huge=2**70)
    error = assert_error(api.get(url), 400, "invalid_request", field)
    assert error["details"]["field"] == field
