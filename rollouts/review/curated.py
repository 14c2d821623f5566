"""Curated exports: NeMo Gym's files of a filtered selection, with the corrected reward or the
env's, optionally carrying the review (``gymweb_review``); and the SFT export.

The options (``reward_source``, ``review=1``), the fields they add and the headers: docs/review.md,
"Curated export". Failure rows keep ``reward: 0.0`` (only succeeded rollouts can be corrected); a
note's ``item`` is the trajectory item ``#N`` it is on, or null. Without either option the files are
exactly ``rollouts.collection.export``'s. All stream from the database with constant memory: rows
are read in chunks, and each chunk's review in three queries.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.http import FileResponse, StreamingHttpResponse

from rollouts.collection import export
from rollouts.downloads import JSONL, file_download, jsonl_download
from rollouts.models import Note, RewardCorrection, Rollout, RolloutLabel, Run
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from rollouts.review import rubric, sft
from rollouts.review.filters import CORRECTED, ORIGINAL  # noqa: F401 (ORIGINAL: re-exported)

CHUNK = 500
TRUE = ("1", "true", "yes", "on")
KINDS = ("rollouts", "rollouts_failures", "rollouts_materialized_inputs")


@dataclass(frozen=True)
class ExportOptions:
    """What a curated export writes (see the module doc)."""

    reward_source: str = ORIGINAL
    review: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ExportOptions:
        """Read ``reward_source`` and ``review`` from a querystring; unknown values mean the defaults."""
        source = str(params.get("reward_source") or "").strip().lower()
        return cls(
            reward_source=CORRECTED if source == CORRECTED else ORIGINAL,
            review=str(params.get("review") or "").strip().lower() in TRUE,
        )

    @property
    def plain(self) -> bool:
        return self.reward_source == ORIGINAL and not self.review


def _who(user) -> str | None:
    return user.get_username() if user is not None else None


def _at(when) -> str | None:
    return when.isoformat() if when is not None else None


def review_info(ids: list[int]) -> dict[int, dict[str, Any]]:
    """Per rollout id: ``{"labels": [...], "notes": [...], "correction": RewardCorrection|None,
    "rubric": [...]}`` (labels, notes and rubric answers as written in ``gymweb_review``), in four
    queries."""
    info: dict[int, dict[str, Any]] = {i: {"labels": [], "notes": [], "correction": None, "rubric": []} for i in ids}
    if not ids:
        return info
    for use in (
        RolloutLabel.objects.filter(rollout_id__in=ids)
        .select_related("label", "created_by")
        .order_by("label__position", "label_id")
    ):
        info[use.rollout_id]["labels"].append(
            {"name": use.label.name, "by": _who(use.created_by), "at": _at(use.created)}
        )
    for note in Note.objects.filter(rollout_id__in=ids).select_related("created_by").order_by("created", "id"):
        info[note.rollout_id]["notes"].append(
            {"text": note.text, "item": note.item_seq, "by": _who(note.created_by), "at": _at(note.created)}
        )
    for corr in RewardCorrection.objects.filter(rollout_id__in=ids).select_related("created_by").order_by("id"):
        info[corr.rollout_id]["correction"] = corr if corr.reward is not None else None  # the newest wins
    for rollout_id, answers in rubric.answers_of(ids).items():
        info[rollout_id]["rubric"] = answers
    return info


def _review_field(info: dict[str, Any], env_reward: float | None, source: str) -> dict[str, Any]:
    corr = info["correction"]
    return {
        "reward_source": source,
        "env_reward": env_reward,
        "corrected_reward": None
        if corr is None
        else {"reward": corr.reward, "reason": corr.reason, "by": _who(corr.created_by), "at": _at(corr.created)},
        "labels": info["labels"],
        "notes": info["notes"],
        "rubric": info["rubric"],
    }


def _chunks(fetch, size: int = CHUNK) -> Iterator[list[tuple]]:
    chunk = []
    for row in fetch.iterator(chunk_size=size):
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _base(run: Run, rollouts: QuerySet | None) -> QuerySet:
    return rollouts if rollouts is not None else Rollout.objects.filter(run=run)


def iter_success_rows(
    run: Run, rollouts: QuerySet | None, options: ExportOptions
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """``(rollouts.jsonl row, review info)`` of each succeeded attempt, the row already curated
    by ``options`` (reward and ``gymweb_review``)."""
    qs = _base(run, rollouts).filter(status=Rollout.Status.SUCCEEDED)
    fetch = qs.order_by("task_index", "rollout_index", "id").values_list(
        "id", "task_index", "rollout_index", "reward", "verify_json", "task__row_json"
    )
    last_task, ref = None, None
    for chunk in _chunks(fetch):
        info = review_info([row[0] for row in chunk])
        for rollout_id, task_index, rollout_index, env_reward, verify_json, task_json in chunk:
            if task_index != last_task:
                last_task, ref = task_index, json.loads(task_json).get("agent_ref") or {"name": run.agent_name}
            row = export.success_row(verify_json, task_index, rollout_index, ref, agent_order=export.agent_ordered(run))
            mine = info[rollout_id]
            source = "env"
            if options.reward_source == CORRECTED:
                if mine["correction"] is not None:
                    row["reward"], source = mine["correction"].reward, "corrected"
                row["_gymweb_reward_source"] = source
            if options.review:
                row["gymweb_review"] = _review_field(mine, env_reward, source)
            yield row, mine


def iter_successes(run: Run, rollouts: QuerySet | None, options: ExportOptions) -> Iterator[str]:
    """Lines of ``rollouts.jsonl`` under ``options`` (exactly ``export.iter_successes`` when plain)."""
    if options.plain:
        yield from export.iter_successes(run, rollouts)
        return
    for row, _info in iter_success_rows(run, rollouts, options):
        yield export.row_line(row)


def iter_failures(run: Run, rollouts: QuerySet | None, options: ExportOptions) -> Iterator[str]:
    """Lines of the failures sidecar; with ``review``, each row carries ``gymweb_review``."""
    if not options.review:
        yield from export.iter_failures(run, rollouts)
        return
    qs = _base(run, rollouts).filter(status=Rollout.Status.FAILED)
    fetch = qs.order_by("task_index", "rollout_index", "attempt", "id").values_list(
        "id", "rollout_index", "error", "nemo_error", "terminal", "failure_kind", "task__row_json"
    )
    for chunk in _chunks(fetch):
        info = review_info([row[0] for row in chunk])
        for rollout_id, rollout_index, error, nemo_error, terminal, _kind, task_json in chunk:
            error = export.sidecar_error(error, nemo_error)
            row = export.failure_row(json.loads(task_json), rollout_index, error, terminal)
            row["gymweb_review"] = _review_field(info[rollout_id], None, "env")
            yield export.row_line(row)


def lines(run: Run, kind: str, rollouts: QuerySet | None, options: ExportOptions) -> Iterator[str]:
    """The lines of file ``kind`` (``KINDS``) for the selection ``rollouts`` (None = the whole run)."""
    if kind == "rollouts":
        return iter_successes(run, rollouts, options)
    if kind == "rollouts_failures":
        return iter_failures(run, rollouts, options)
    if kind == "rollouts_materialized_inputs":
        return export.iter_materialized(run)
    raise ValueError(f"unknown file {kind!r}; one of {', '.join(KINDS)}")


def sft_lines(
    run: Run,
    rollouts: QuerySet | None,
    options: ExportOptions,
    *,
    reasoning: str = "keep",
    metadata: bool = False,
    skipped: list[str] | None = None,
    left_out: Counter | None = None,
) -> Iterator[str]:
    """SFT lines (``rollouts.review.sft``) of the selection's succeeded attempts. ``metadata`` adds
    ``"metadata": {"run", "task_index", "rollout_index", "reward", "reward_source", "labels", "rubric"}``
    (``reward`` by ``options.reward_source``). Rows that cannot be made valid chat examples are left
    out, named in ``skipped`` and counted by reason in ``left_out``."""
    for row, info in iter_success_rows(run, rollouts, ExportOptions(reward_source=options.reward_source)):
        try:
            out = sft.conversation(row, reasoning=reasoning)
        except sft.NotConvertible as exc:
            if skipped is not None:
                skipped.append(f"task {row[TASK_INDEX_KEY_NAME]} rollout {row[ROLLOUT_INDEX_KEY_NAME]}: {exc}")
            if left_out is not None:
                left_out[exc.reason] += 1
            continue
        if metadata:
            out["metadata"] = {
                "run": run.pk,
                "task_index": row[TASK_INDEX_KEY_NAME],
                "rollout_index": row[ROLLOUT_INDEX_KEY_NAME],
                "reward": row.get("reward"),
                "reward_source": row.get("_gymweb_reward_source", "env"),
                "labels": [entry["name"] for entry in info["labels"]],
                "rubric": info["rubric"],
            }
        yield json.dumps(out, ensure_ascii=False)


SFT_SPOOL_BYTES = 32 * 1024 * 1024


def sft_response(
    run: Run,
    rollouts: QuerySet | None,
    options: ExportOptions,
    filename: str,
    *,
    reasoning: str = "keep",
    metadata: bool = False,
) -> FileResponse:
    """The SFT download (``sft_lines``), written whole first (in memory up to ``SFT_SPOOL_BYTES``,
    then a temporary file) so that its headers can say what was left out: ``X-Gymweb-Rows``
    (rows written), ``X-Gymweb-Left-Out`` (rows left out) and ``X-Gymweb-Left-Out-Reasons``
    (``sft.left_out_text``, ASCII)."""
    left_out: Counter = Counter()
    spool = tempfile.SpooledTemporaryFile(max_size=SFT_SPOOL_BYTES, mode="w+b")
    rows = 0
    for line in sft_lines(run, rollouts, options, reasoning=reasoning, metadata=metadata, left_out=left_out):
        spool.write(line.encode("utf-8") + b"\n")
        rows += 1
    spool.seek(0)

    response = file_download(spool, filename, f"{JSONL}; charset=utf-8")
    response["X-Gymweb-Reward-Source"] = options.reward_source
    response["X-Gymweb-Review"] = "included" if options.review else "omitted"
    response["X-Gymweb-Rows"] = str(rows)
    response["X-Gymweb-Left-Out"] = str(sum(left_out.values()))
    response["X-Gymweb-Left-Out-Reasons"] = sft.left_out_text(left_out).encode("ascii", "replace").decode("ascii")
    return response


def sft_check(
    run: Run, rollouts: QuerySet | None, options: ExportOptions, *, reasoning: str = "keep"
) -> tuple[int, Counter]:
    """``(rows the SFT export writes, rows left out counted by reason)`` for the selection."""
    left_out: Counter = Counter()
    rows = sum(1 for _ in sft_lines(run, rollouts, options, reasoning=reasoning, left_out=left_out))
    return rows, left_out


def streaming_response(line_iter: Iterator[str], filename: str, options: ExportOptions) -> StreamingHttpResponse:
    """A JSONL download of ``line_iter`` that says which reward it uses and whether it carries the
    review (headers ``X-Gymweb-Reward-Source``, ``X-Gymweb-Review``)."""
    response = jsonl_download(line_iter, filename)
    response["X-Gymweb-Reward-Source"] = options.reward_source
    response["X-Gymweb-Review"] = "included" if options.review else "omitted"
    return response
