"""The numbers NeMo Gym's profiler reads from one ``rollouts.jsonl`` row, stored beside each success.

Collection writes them (``rollouts.workers.writer`` when a rollout succeeds, ``importer`` for imported
rows) into ``Rollout.profile_json``; evaluation (``rollouts.evaluation.reward_profile``/``profile_report``)
reads them, so a run's profile never parses a response. They live here, in collection, so that evaluation imports
collection and never the reverse (DESIGN.md, "Suggested layout").

What is read from a row is NeMo Gym 0.7.0's ``RewardProfiler`` (``nemo_gym/reward_profile.py``):
``rollout_info_from_result`` (the row's part of a task's ``rollout_infos``) and the numeric record of
``profile_from_data`` (every top-level number of the row, then ``response.usage``'s, bools as 0/1,
``_``-prefixed keys skipped; ``mask_sample`` is a flag, not a number: NeMo Gym's ``select_measured``
strips it).

No Django, no third-party imports: the data migration that filled the column for older rows
(``rollouts/migrations/0005``) imports it too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from collections.abc import Mapping as _MappingABC
from typing import Any

from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = [
    "MASK_SAMPLE_FIELD",
    "PROFILE_NUMBERS_PREFIX",
    "PROFILE_NUMBERS_VERSION",
    "dumps_profile_numbers",
    "loads_profile_numbers",
    "numeric",
    "profile_json_for_verify",
    "profile_numbers",
    "row_numbers",
    "usage_of",
]

log = logging.getLogger(__name__)

MASK_SAMPLE_FIELD = "mask_sample"

# Bump it whenever row_numbers changes what it takes from a row: records stored with another version
# are then ignored (profile_run reads verify_json for them, with the right result, only slower) until
# a data migration like rollouts/migrations/0005 stores them again.
PROFILE_NUMBERS_VERSION = 1
# How an encoded record starts (``dumps_profile_numbers``): a stored record without it is stale.
PROFILE_NUMBERS_PREFIX = '{"v":%d,' % PROFILE_NUMBERS_VERSION


def numeric(v: Any) -> Any:
    """NeMo Gym's filter: bools become 0/1, ints and floats pass, anything else (None) is not profiled."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    return None


def usage_of(result: Mapping[str, Any]) -> Mapping[str, Any]:
    """``result["response"]["usage"]`` when both are objects, else ``{}`` (NeMo Gym's
    ``(result.get("response") or {}).get("usage") or {}``)."""
    response = result.get("response") or {}
    usage = response.get("usage") if isinstance(response, (dict, _MappingABC)) else None
    return usage if isinstance(usage, (dict, _MappingABC)) else {}


def row_numbers(result: Mapping[str, Any]) -> tuple[bool, list[str], list[Any], dict[str, Any]]:
    """Everything NeMo Gym's profiler reads from a rollout row apart from its key: ``(masked, names,
    values, info)``, i.e. ``mask_sample``'s truth, the numeric record of ``profile_from_data``
    (field names and values in column order) and the row's part of ``rollout_info_from_result``
    (``rollout_id`` and the two indices come first, from the key, when profiling)."""
    masked = bool(result.get(MASK_SAMPLE_FIELD))
    usage = usage_of(result)

    # rollout_info_from_result (mask_sample is stripped from measured rows before profiling).
    info: dict[str, Any] = {}
    if "reward" in result:
        info["reward"] = result.get("reward")
    for k, v in usage.items():
        nv = numeric(v)
        if nv is not None:
            info[k] = nv
    for k, v in result.items():
        if k.startswith("_") or k in ("reward", "response") or k == MASK_SAMPLE_FIELD:
            continue
        nv = numeric(v)
        if nv is not None:
            info[k] = nv

    # numeric record: (result | usage), "_"-prefixed keys skipped.
    merged: dict[str, Any] = {}
    for k, v in result.items():
        if k == MASK_SAMPLE_FIELD:
            continue
        merged[k] = v
    for k, v in usage.items():
        merged[k] = v
    names: list[str] = []
    values: list[Any] = []
    for k, v in merged.items():
        if k.startswith("_") or k == "agent_name":
            # "agent_name" would clobber NeMo Gym's temporary grouping column; it is not profiled.
            continue
        nv = numeric(v)
        if nv is not None:
            names.append(k)
            values.append(nv)
    return masked, names, values, info


def profile_numbers(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the profiler reads from one rollout row, apart from the row's key: a small dict to store
    beside the row and profile later without the row (``profile.ReducedRollout``).

    ``{"v": PROFILE_NUMBERS_VERSION, "masked": bool, "numbers": {field: value}, "info": {field: value}}``:
    ``masked`` is ``mask_sample``'s truth, ``numbers`` the profiled fields in column order (numeric
    top-level fields, then ``response.usage``'s; bools as 0/1) and ``info`` the row's part of its
    ``rollout_infos`` record (raw ``reward``, usage numbers, other numbers). Computed by the very
    code that reduces full rows when profiling, so the two cannot differ. It does not depend on the
    values of the row's ``_ng_task_index``/``_ng_rollout_index`` (the key is joined back when
    profiling); it does depend on every other field, ``agent_ref`` included (its position and, when
    it is not an object, its value), so compute it from the row as ``rollouts.jsonl`` carries it.
    JSON-safe for rows parsed from JSON (``dumps_profile_numbers``).
    """
    masked, names, values, info = row_numbers(row)
    return {"v": PROFILE_NUMBERS_VERSION, "masked": masked, "numbers": dict(zip(names, values)), "info": info}


_encode_compact = json.JSONEncoder(separators=(",", ":")).encode
_raw_decode = json.JSONDecoder().raw_decode


def dumps_profile_numbers(numbers: Mapping[str, Any]) -> str:
    """``profile_numbers(row)`` as compact ASCII JSON text starting with ``PROFILE_NUMBERS_PREFIX``
    (floats round-trip exactly). ``info`` is left out when it encodes exactly like ``numbers`` (the
    usual case: reward, then the usage numbers); ``loads_profile_numbers`` puts it back."""
    record = _encode_compact(numbers["numbers"])
    info = _encode_compact(numbers["info"])
    masked = "true" if numbers["masked"] else "false"
    text = f'{PROFILE_NUMBERS_PREFIX}"masked":{masked},"numbers":{record}'
    return text + ("}" if info == record else f',"info":{info}}}')


def loads_profile_numbers(text: str) -> dict[str, Any] | None:
    """The ``profile_numbers`` record ``dumps_profile_numbers`` wrote (its ``info`` may be the same
    dict as its ``numbers``: read only), or None when ``text`` is blank, of another version or not
    such a record (the caller then reduces the full row instead)."""
    if not text or not text.startswith(PROFILE_NUMBERS_PREFIX):
        return None
    try:
        numbers, end = _raw_decode(text)  # json.loads without its per-call overhead
    except ValueError:
        return None
    if end != len(text):
        return None
    if not (
        isinstance(numbers, dict)
        and numbers.get("v") == PROFILE_NUMBERS_VERSION
        and isinstance(numbers.get("masked"), bool)
        and isinstance(numbers.get("numbers"), dict)
    ):
        return None
    info = numbers.setdefault("info", numbers["numbers"])
    return numbers if isinstance(info, dict) else None


def profile_json_for_verify(verify: Mapping[str, Any], agent_ref: Any = None) -> str:
    """``Rollout.profile_json`` of a success whose env ``/verify`` reply is ``verify`` (a dict, as
    parsed from JSON): ``profile_numbers`` of its ``rollouts.jsonl`` row, encoded.

    The row is built the way ``export.success_row`` builds it: the reply, then ``_ng_task_index``,
    ``_ng_rollout_index`` (their values are not part of the numbers, so placeholders do) and
    ``agent_ref`` (the ``_ng_environment_server``/``_ng_result_type`` stamps the export adds after
    them are strings under ``_`` names: never profiled). ``agent_ref`` is the value the export writes
    there (the task row's, else ``{"name": run.agent_name}``); None stands for an object, which it
    always is for the runs gymweb stores (``datasets.validate_row`` requires an object for collected
    and imported rows alike): only a non-object value would be profiled. Returns "" (unknown:
    ``profile_run`` then reads ``verify_json``) if the numbers cannot be computed, so storing a
    result never fails because of them.
    """
    row = dict(verify)
    row[TASK_INDEX_KEY_NAME] = 0
    row[ROLLOUT_INDEX_KEY_NAME] = 0
    row["agent_ref"] = {} if agent_ref is None else agent_ref
    try:
        return dumps_profile_numbers(profile_numbers(row))
    except Exception as exc:  # pragma: no cover - a reply parsed from JSON always encodes
        log.warning(
            "profile numbers not stored (%s: %s); the profile will read the full reply", exc.__class__.__name__, exc
        )
        return ""
