"""ATIF export: a stored run's trajectories as the Agent Trajectory Interchange Format v1.7 that NeMo
Gym 0.7.0's ``gym eval export --format atif`` writes (``nemo_gym/atif_export.py``,
``nemo_gym/atif_v1_7.py``).

NeMo Gym builds ATIF from the ``ng_trajectory`` its own agents persist; a remote_agent row has none,
so it cannot export those runs. gymweb stores every step, so it builds each trajectory from them:

- the task's ``responses_create_params.input`` messages (system, user) become the first steps
  (a string input is one user message; ``instructions`` a system step);
- every agent call becomes one ``agent`` step: ``message`` = the reply's assistant text (``""``
  when it only asked for tools), ``reasoning_content`` = its reasoning text, ``tool_calls`` = its
  ``function_call`` items (arguments parsed; arguments that are not a JSON object are kept raw in
  the call's ``extra``), ``observation`` = the ``function_call_output`` items answering them (the
  tool outputs gymweb got from the env, or the agent's own tool records), ``metrics`` = the call's
  ``usage`` (prompt/completion/cached tokens; reasoning and total tokens in ``extra`` as NeMo Gym
  does), ``model_name``, ``timestamp`` (when the call started, ISO 8601); a failed call's error
  and HTTP status, items ATIF has no field for (hosted-tool calls, refusals...) and gymweb's step
  data go in the step's ``extra.gymweb``;
- ``final_metrics`` sums the steps' tokens when every step reports them; ``extra.gymweb`` says
  where the trajectory came from (run, rollout, reward, failure).

Files, as NeMo Gym lays them out: ``<task>-<rollout>.json`` per trajectory (pretty JSON, 2-space
indent, no nulls, trailing newline) and ``manifest.jsonl`` (``trajectory_path``, the two indices,
``expected_sha256`` of the file; keys sorted, compact). Every trajectory is validated against the
JSON schema kept in the repo (``schemas/atif-v1.7.schema.json``) and the rules the schema cannot say
(sequential ``step_id``, observations naming a tool call of their step, agent-only fields).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from rollouts.models import AgentCall, Rollout, Run, TrajectoryItem
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = [
    "ATIF_SCHEMA_VERSION",
    "SCHEMA_PATH",
    "AtifError",
    "export_run",
    "rollout_trajectory",
    "validate",
    "write_export",
    "iter_trajectories",
]

ATIF_SCHEMA_VERSION = "ATIF-v1.7"
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "atif-v1.7.schema.json"
MANIFEST = "manifest.jsonl"
CHUNK = 100


class AtifError(ValueError):
    """A trajectory is not valid ATIF v1.7, or the export cannot be written; says what and where."""


@lru_cache(maxsize=1)
def _validator():
    from jsonschema import Draft202012Validator

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def validate(trajectory: dict[str, Any], where: str = "trajectory") -> None:
    """Check one ATIF document against the repo's JSON schema and the cross-field rules of NeMo
    Gym's models. Raises ``AtifError`` naming the first problem's path."""
    errors = sorted(_validator().iter_errors(trajectory), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
        raise AtifError(f"{where}{path}: {e.message}")
    for index, step in enumerate(trajectory["steps"]):
        if step["step_id"] != index + 1:
            raise AtifError(
                f"{where}.steps[{index}].step_id: expected {index + 1} (sequential from 1), got {step['step_id']}"
            )
        if step["source"] != "agent":
            for name in ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics"):
                if step.get(name) is not None:
                    raise AtifError(f"{where}.steps[{index}].{name}: only valid for agent steps")
        ids = {c["tool_call_id"] for c in step.get("tool_calls") or []}
        for result in (step.get("observation") or {}).get("results", []):
            if result.get("source_call_id") is not None and result["source_call_id"] not in ids:
                raise AtifError(
                    f"{where}.steps[{index}].observation: references unknown tool call {result['source_call_id']!r}"
                )
    final = trajectory.get("final_metrics") or {}
    if final.get("total_steps") is not None and final["total_steps"] != len(trajectory["steps"]):
        raise AtifError(
            f"{where}.final_metrics.total_steps: expected {len(trajectory['steps'])}, got {final['total_steps']}"
        )


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _text_parts(content: Any) -> str | list[dict[str, Any]] | None:
    """ATIF content from a Responses content value: a string stays a string; text parts become
    ``{"type": "text", "text"}`` parts; None when nothing textual is there."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            {"type": "text", "text": p["text"]}
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
        return parts or None
    return None


def _plain_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or p.get("refusal") or "" for p in content if isinstance(p, dict))
    return ""


def _input_steps(task_row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The system/user steps of the task's input, and input items ATIF has no step for."""
    params = task_row.get("responses_create_params") or {}
    steps, other = [], []
    if isinstance(params.get("instructions"), str) and params["instructions"]:
        steps.append({"source": "system", "message": params["instructions"]})
    items = params.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items or []:
        role = item.get("role") if isinstance(item, dict) else None
        if role in ("system", "developer", "user") and item.get("type", "message") == "message":
            content = _text_parts(item.get("content"))
            if content is not None:
                steps.append({"source": "system" if role == "developer" else role, "message": content})
                continue
        other.append(item)
    return steps, other


def _tool_call(p: dict[str, Any], item: TrajectoryItem) -> dict[str, Any]:
    """A ``function_call`` item as an ATIF tool call (unparseable arguments kept raw under ``extra``)."""
    raw = p.get("arguments")
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        parsed = None
    extra: dict[str, Any] = {"source_item_id": p["id"]} if isinstance(p.get("id"), str) else {}
    if not isinstance(parsed, dict):
        parsed, extra["raw_arguments"] = {}, raw
    if item.asked:
        extra["asked"] = True
    return {
        "tool_call_id": p["call_id"],
        "function_name": str(p.get("name") or ""),
        "arguments": parsed,
        "extra": {"gymweb": extra} if extra else None,
    }


def _tool_result(p: dict[str, Any], item: TrajectoryItem, call_ids: set[str]) -> dict[str, Any]:
    """A ``function_call_output`` item as an ATIF observation result (its call id under ``extra``
    when no earlier tool call of the step has it)."""
    content = p.get("output")
    content = content if isinstance(content, str) else _text_parts(content) or json.dumps(content, ensure_ascii=False)
    extra = {
        k: v
        for k, v in (
            ("origin", item.origin),
            ("refused", item.refused or None),
            ("tool_status", item.tool_status),
            ("latency_ms", item.latency_ms),
        )
        if v is not None
    }
    result: dict[str, Any] = {
        "source_call_id": p.get("call_id") if p.get("call_id") in call_ids else None,
        "content": content,
        "extra": {"gymweb": extra},
    }
    if p.get("call_id") not in call_ids and p.get("call_id") is not None:
        result["extra"]["gymweb"]["call_id"] = p.get("call_id")
    return result


def _agent_step(call: AgentCall | None, items: list[TrajectoryItem]) -> dict[str, Any]:
    texts, reasoning, tool_calls, results, extra_items = [], [], [], [], []
    call_ids: set[str] = set()
    for item in items:
        p = item.payload if isinstance(item.payload, dict) else {}
        kind = p.get("type")
        if kind == "message" and p.get("role", "assistant") == "assistant":
            texts.append(_plain_text(p.get("content")))
        elif kind == "reasoning":
            segments = [
                s.get("text")
                for s in (p.get("content") or p.get("summary") or [])
                if isinstance(s, dict) and isinstance(s.get("text"), str)
            ]
            reasoning.extend(segments)
        elif kind == "function_call" and isinstance(p.get("call_id"), str):
            tool_calls.append(_tool_call(p, item))
            call_ids.add(p["call_id"])
        elif kind == "function_call_output":
            results.append(_tool_result(p, item, call_ids))
        else:
            extra_items.append(p)
    step: dict[str, Any] = {"source": "agent", "message": "\n".join(t for t in texts if t) if texts else ""}
    if reasoning:
        step["reasoning_content"] = "\n".join(reasoning)
    if tool_calls:
        step["tool_calls"] = tool_calls
    if results:
        step["observation"] = {"results": results}
    gymweb: dict[str, Any] = {}
    if call is not None:
        step["timestamp"] = call.started.isoformat() if call.started else None
        step["model_name"] = call.model or None
        usage = call.usage if isinstance(call.usage, dict) else None
        if usage:
            cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
            extra = {
                k: v
                for k, v in (
                    ("reasoning_tokens", (usage.get("output_tokens_details") or {}).get("reasoning_tokens")),
                    ("total_tokens", usage.get("total_tokens")),
                )
                if isinstance(v, int) and v >= 0
            }
            good = lambda v: v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None  # noqa: E731
            step["metrics"] = {
                "prompt_tokens": good(usage.get("input_tokens")),
                "completion_tokens": good(usage.get("output_tokens")),
                "cached_tokens": good(cached),
                "extra": extra or None,
            }
        gymweb.update(
            {
                "agent_call": call.index,
                "latency_ms": call.latency_ms,
                "http_status": call.http_status,
                "response_id": call.response_id or None,
                "incomplete_details": call.incomplete_details,
                "error": call.error or None,
            }
        )
    if extra_items:
        gymweb["items"] = extra_items
    gymweb = {k: v for k, v in gymweb.items() if v is not None}
    if gymweb:
        step["extra"] = {"gymweb": gymweb}
    return step


def rollout_trajectory(
    run: Run,
    rollout: Rollout,
    task_row: dict[str, Any],
    calls: list[AgentCall],
    items: list[TrajectoryItem],
    *,
    session_id: str,
    agent_version: str,
) -> dict[str, Any]:
    """One rollout as an ATIF v1.7 document (a dict without nulls), see the module docstring."""
    steps, other_inputs = _input_steps(task_row)
    by_step: dict[int, list[TrajectoryItem]] = defaultdict(list)
    for item in items:
        by_step[item.step].append(item)
    call_of = {c.index: c for c in calls}
    for index in sorted(set(call_of) | set(by_step)):
        steps.append(_agent_step(call_of.get(index), by_step.get(index, [])))
    if not steps:
        steps.append({"source": "user", "message": ""})
    for number, step in enumerate(steps, 1):
        step["step_id"] = number
    agent_steps = [s for s in steps if s["source"] == "agent"]
    metrics = [s.get("metrics") for s in agent_steps]

    def total(name: str) -> int | None:
        if not metrics or any(m is None or m.get(name) is None for m in metrics):
            return None
        return sum(m[name] for m in metrics)

    models = {s.get("model_name") for s in agent_steps}
    agent_ref = task_row.get("agent_ref") if isinstance(task_row.get("agent_ref"), dict) else {}
    tools = (task_row.get("responses_create_params") or {}).get("tools")
    source = {
        "format": "gymweb_steps",
        "run_id": run.pk,
        "rollout_id": rollout.pk,
        "task_index": rollout.task_index,
        "rollout_index": rollout.rollout_index,
        "attempt": rollout.attempt,
        "status": rollout.status,
        "reward": rollout.reward,
        "failure_kind": rollout.failure_kind or None,
        "error": rollout.error or None,
        "imported": run.status == Run.Status.IMPORTED or None,
    }
    if other_inputs:
        source["other_input_items"] = other_inputs
    doc = {
        "schema_version": ATIF_SCHEMA_VERSION,
        "session_id": session_id,
        "trajectory_id": f"{session_id}:{rollout.task_index}:{rollout.rollout_index}",
        "agent": {
            "name": str(agent_ref.get("name") or run.agent_name),
            "version": agent_version,
            "model_name": next(iter(models)) if len(models) == 1 else None,
            "tool_definitions": [t for t in tools if isinstance(t, dict)]
            if isinstance(tools, list) and tools
            else None,
        },
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": total("prompt_tokens"),
            "total_completion_tokens": total("completion_tokens"),
            "total_cached_tokens": total("cached_tokens"),
            "total_steps": len(steps),
        },
        "extra": {"gymweb": {"exporter": {"name": "gymweb", "profile": "gymweb-steps-to-atif-v1.7"}, "source": source}},
    }
    return _drop_none(doc)


def exported_rollouts(run: Run, include_failures: bool = False) -> list[int]:
    """Ids of the rollouts to export: successes (NeMo Gym exports ``rollouts.jsonl``), and with
    ``include_failures`` the latest failed attempt of each key without a success."""
    S = Rollout.Status
    wanted = [S.SUCCEEDED, S.FAILED] if include_failures else [S.SUCCEEDED]
    chosen: dict[tuple[int, int], tuple[int, str]] = {}
    for pk, t, r, status in (
        Rollout.objects.filter(run=run, status__in=wanted)
        .order_by("task_index", "rollout_index", "attempt", "id")
        .values_list("id", "task_index", "rollout_index", "status")
    ):
        previous = chosen.get((t, r))
        if previous is None or previous[1] != S.SUCCEEDED:
            chosen[(t, r)] = (pk, status)
    return [pk for pk, _ in chosen.values()]


def iter_trajectories(
    run: Run, *, session_id: str = "", agent_version: str = "unspecified", include_failures: bool = False
) -> Iterator[tuple[Rollout, dict[str, Any]]]:
    """``(rollout, ATIF document)`` for the exported rollouts of ``run``, in key order, each
    validated (``AtifError`` otherwise). Reads calls and items a chunk of rollouts at a time."""
    session_id = session_id or f"gymweb-run-{run.pk}"
    ids = exported_rollouts(run, include_failures)
    for start in range(0, len(ids), CHUNK):
        part = ids[start : start + CHUNK]
        rollouts = list(
            Rollout.objects.filter(id__in=part).select_related("task").order_by("task_index", "rollout_index")
        )
        calls: dict[int, list[AgentCall]] = defaultdict(list)
        for c in AgentCall.objects.filter(rollout_id__in=part).order_by("rollout_id", "index"):
            calls[c.rollout_id].append(c)
        items: dict[int, list[TrajectoryItem]] = defaultdict(list)
        for i in TrajectoryItem.objects.filter(rollout_id__in=part).order_by("rollout_id", "seq"):
            items[i.rollout_id].append(i)
        for r in rollouts:
            try:
                task_row = json.loads(r.task.row_json)
            except ValueError:
                task_row = {}
            doc = rollout_trajectory(
                run,
                r,
                task_row,
                calls.get(r.pk, []),
                items.get(r.pk, []),
                session_id=session_id,
                agent_version=agent_version,
            )
            validate(doc, f"task {r.task_index} rollout {r.rollout_index}")
            yield r, doc


def encode(doc: dict[str, Any]) -> bytes:
    """A trajectory file's bytes, as NeMo Gym writes them (2-space indent, trailing newline)."""
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def manifest_line(task_index: int, rollout_index: int, data: bytes) -> str:
    """One ``manifest.jsonl`` line (NeMo Gym's keys, sorted, compact)."""
    return json.dumps(
        {
            "trajectory_path": f"{task_index}-{rollout_index}.json",
            TASK_INDEX_KEY_NAME: task_index,
            ROLLOUT_INDEX_KEY_NAME: rollout_index,
            "expected_sha256": hashlib.sha256(data).hexdigest(),
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def export_run(
    run: Run,
    output_dir: str | Path,
    *,
    overwrite: bool = False,
    session_id: str = "",
    agent_version: str = "unspecified",
    include_failures: bool = False,
) -> tuple[Path, int]:
    """Write the run's ATIF files into ``output_dir`` (see the module docstring); all or nothing: the
    files are built in a temporary folder beside it and moved into place. Returns ``(dir, count)``.

    Raises ``AtifError`` when the folder exists and is not empty (unless ``overwrite``; then it is
    replaced), when the run has nothing to export, or when a trajectory does not validate."""
    out = Path(output_dir).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise AtifError(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise AtifError(f"{out} already exists and is not empty; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        lines = []
        for r, doc in iter_trajectories(
            run, session_id=session_id, agent_version=agent_version, include_failures=include_failures
        ):
            data = encode(doc)
            (staging / f"{r.task_index}-{r.rollout_index}.json").write_bytes(data)
            lines.append(manifest_line(r.task_index, r.rollout_index, data))
        if not lines:
            raise AtifError(
                f"run #{run.pk} has no {'finished' if include_failures else 'successful'} rollouts to export"
            )
        (staging / MANIFEST).write_text("\n".join(lines) + "\n", encoding="utf-8")
        staging.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out, len(lines)


def write_export(run: Run, fileobj, **options: Any) -> int:
    """The export as one zip archive (the run page's download) written to ``fileobj``: the same
    files as ``export_run``, under a folder named after the session. Returns the trajectory count."""
    import zipfile

    session = options.get("session_id") or f"gymweb-run-{run.pk}"
    lines = []
    with zipfile.ZipFile(fileobj, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for r, doc in iter_trajectories(run, **options):
            data = encode(doc)
            zf.writestr(f"{session}/{r.task_index}-{r.rollout_index}.json", data)
            lines.append(manifest_line(r.task_index, r.rollout_index, data))
        zf.writestr(f"{session}/{MANIFEST}", ("\n".join(lines) + "\n") if lines else "")
    return len(lines)
