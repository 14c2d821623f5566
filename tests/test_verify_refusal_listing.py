"""A refused ``/verify`` reply's failure text is pydantic's listing, as NeMo Gym 0.7.0's remote_agent
writes it (``RemoteAgentVerifyResponse.model_validate`` raises; its ``run()`` catches the error and
writes ``unexpected error: ValidationError: `` and the listing as the failure row's ``error``; see
``tests/test_verify_refusal_rows.py`` for whole rows). ``tests/data/verify_refusal_listings.json``
holds NeMo Gym's own text for each refused reply of the recorded corpus
(``tests/data/agent_results.json``), made in NeMo Gym 0.7.0's venv with::

    from responses_api_agents.remote_agent.app import RemoteAgentVerifyResponse
    for case in refused_cases:
        try: RemoteAgentVerifyResponse.model_validate(case["reply"])
        except Exception as e: listings[case["case"]] = repr(e)
"""

from __future__ import annotations

import json
from pathlib import Path

from rollouts.engine.nemo_request import verify_refusal_error, verify_refusal_listing

DATA = Path(__file__).parent / "data"
# NeMo Gym lists its input item union's every branch by name; gymweb checks items apart from the
# model, so this one listing differs after its first error.
UNION_CASE = "responses_create_params input a number"


def _recorded() -> tuple[dict, dict]:
    listings = json.loads((DATA / "verify_refusal_listings.json").read_text())
    cases = {c["case"]: c for c in json.loads((DATA / "agent_results.json").read_text())["cases"]}
    return listings, cases


def test_every_refused_reply_is_listed_as_nemo_gym_lists_it():
    listings, cases = _recorded()
    assert len(listings) >= 15
    for name, nemo_text in listings.items():
        mine = verify_refusal_listing(cases[name]["reply"])
        if name == UNION_CASE:
            assert mine.splitlines()[:4] == nemo_text.splitlines()[:4]
            assert mine.split("\n", 1)[0] == "2 validation errors for RemoteAgentVerifyResponse"
        else:
            assert mine == nemo_text, name


def test_a_long_listing_is_written_whole_after_nemo_gyms_words():
    listings, cases = _recorded()
    reply = dict(cases["no reward"]["reply"], mask_sample=[], failure_kind=[], failure_reason=[])
    reply["response"] = dict(reply["response"], output=[{"type": "message", "role": "nobody"}] * 40)
    error = verify_refusal_error(reply)
    assert error.startswith("unexpected error: ValidationError: ") and len(error) > 4000
    assert error.endswith(verify_refusal_listing(reply)) and "…" not in error
