"""gymweb accepts and rejects exactly the agent replies NeMo Gym 0.7.0 does (contract rule 3).

``tests/data/reply_corpus.jsonl``: real NeMo Gym replies and made-up edge cases, each with the verdict
of the real ``NeMoGymResponse`` recorded once by ``scripts/record_reply_corpus.py`` (in a NeMo Gym
venv; never imported here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollouts.engine.contract import InvalidReply, parse_reply

CORPUS = Path(__file__).resolve().parent / "data" / "reply_corpus.jsonl"


def _cases() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_corpus_has_real_and_made_up_replies_and_both_verdicts():
    cases = _cases()
    assert len(cases) >= 80
    assert {c["source"] for c in cases} == {"real", "made_up"}
    verdicts = [c["nemo_gym"]["valid"] for c in cases]
    assert verdicts.count(True) >= 20 and verdicts.count(False) >= 20
    assert all(c["nemo_gym"]["reason"] for c in cases if not c["nemo_gym"]["valid"])


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["case"])
def test_gymweb_gives_nemo_gyms_verdict(case):
    try:
        parse_reply(case["reply"])
        accepted, why = True, None
    except InvalidReply as exc:
        accepted, why = False, str(exc)
    assert accepted == case["nemo_gym"]["valid"], (
        f"NeMo Gym {'accepts' if case['nemo_gym']['valid'] else 'rejects'} this reply "
        f"({case['nemo_gym']['reason']}); gymweb {'accepts' if accepted else 'rejects'} it ({why})"
    )


@pytest.mark.parametrize(
    "name, path",
    [
        ("web_search_call without action", ["output", 0, "action"]),
        ("incomplete_details reason because", ["incomplete_details", "reason"]),
        ("status weird", ["status"]),
        ("partial usage: no total_tokens", ["usage", "total_tokens"]),
        ("function_call without call_id", ["output", 0, "call_id"]),
    ],
)
def test_each_refusal_points_into_the_body_by_json_path(name, path):
    case = next(c for c in _cases() if c["case"] == name)
    with pytest.raises(InvalidReply) as info:
        parse_reply(case["reply"])
    assert info.value.errors, "an invalid reply carries its errors"
    assert path in [e["path"] for e in info.value.errors]
    assert ".".join(map(str, path)) in str(info.value)
