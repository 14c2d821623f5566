"""Delete, archive and restore runs (docs/delete-and-archive.md).

- ``delete_run``: the run and everything under it (tasks, rollouts, agent calls, trajectory items,
  health verdicts, labels on its rollouts, notes, corrections, review lists), ``batch`` rollouts
  per transaction, so no write lock lasts long however large the run. Datasets stay (other runs may
  use them); datasets made from the run's selection and runs reverified from it keep existing
  without the link.
- ``archive_run``: writes the run's NeMo Gym files (``export.iter_successes``, ``iter_failures``,
  ``iter_materialized``: the export's own lines) zstd-compressed to
  ``GYMWEB_ARCHIVE_DIR/run-<id>/``, with ``gymweb_details.jsonl.zst`` (what only gymweb stores:
  agent calls, items with their origin and tool latency, a failure's partial response) and
  ``manifest.json`` (lines and SHA-256 of each file's uncompressed bytes). Then it marks the run
  archived and drops, in batches, its items, agent calls and stored responses (``verify_json``,
  ``partial_response_json``). Rollout rows stay with every number the pages aggregate (status,
  reward, tokens, durations, profile numbers, errors), and so do tasks, labels, notes, corrections
  and health verdicts.
- ``restore_run``: checks the files against the manifest, then puts back what archiving dropped,
  byte for byte (so every download is the one before archiving), and removes the files.

Only a final run (completed, cancelled, imported) with no rollout in flight can be deleted or
archived: a run being collected is refused (``RunBusy``), never cancelled behind the user's back.
Cancel it first. Every step can be run again after a crash: delete continues; archive marks the
run archived only once its files are complete, drops nothing before they read back as written, and
archiving it again finishes the drop; restore replaces what a partial restore wrote.

While a run is archived, its plain ``rollouts.jsonl`` is read from the archive
(``archived_lines``); the failures and materialised inputs are still written from the database (the
rows they need are kept). What needs the items or the responses (trajectory pages, filtered or
curated ``rollouts.jsonl``, SFT, health check, reverify) raises ``RunArchived``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import zstandard
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from rollouts.bulk import insert_ignoring_conflicts
from rollouts.collection import export
from rollouts.collection.archive_files import (
    FILES,
    FORMAT,
    MANIFEST,
    ZSTD_LEVEL,
    ArchiveError,
    RunArchived,
    RunBusy,
    archived_lines,
    read_lines,
    shown,
    why,
)
from rollouts.collection.profile_numbers import profile_json_for_verify
from rollouts.collection.stamps import ENVIRONMENT_SERVER_KEY, RESULT_TYPE_KEY
from rollouts.durations import parse_duration
from rollouts.engine.nemo_request import agent_result
from rollouts.lossless import dumps
from rollouts.models import AgentCall, ReviewList, Rollout, Run, Task, TrajectoryItem, forget_field_values
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from rollouts.search.text import fill_missing

__all__ = [
    "ArchiveError",
    "RunArchived",
    "RunBusy",
    "Outcome",
    "archive_dir",
    "archive_run",
    "archived_lines",
    "delete_run",
    "download_refusal",
    "parse_age",
    "prune",
    "prune_candidates",
    "require_archived",
    "require_items",
    "restore_run",
    "verify_file",
    "verify_files",
    "FILES",
]

_ITEM_FIELDS = (
    "seq",
    "step",
    "kind",
    "role",
    "call_id",
    "name",
    "origin",
    "asked",
    "paired",
    "refused",
    "latency_ms",
    "tool_status",
)
_CALL_FIELDS = (
    "index",
    "latency_ms",
    "http_status",
    "response_id",
    "model",
    "usage",
    "incomplete_details",
    "num_asks",
    "error",
)


@dataclass
class Outcome:
    """What one delete, archive or restore did: rows touched, seconds, and the longest single
    transaction (the longest time a write lock was held)."""

    run: int
    rollouts: int = 0
    items: int = 0
    agent_calls: int = 0
    batches: int = 0
    seconds: float = 0.0
    longest_transaction_s: float = 0.0
    path: str = ""
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    durations: list[float] = field(default_factory=list, repr=False)  # each transaction's seconds

    def timed(self, fn: Callable[[], Any]) -> Any:
        """Run one write transaction ``fn``, note its time, then pause ``GYMWEB_DELETE_PAUSE_S`` so
        a writer waiting for the lock gets it (SQLite's busy wait polls; without a gap, batch after
        batch could keep it waiting)."""
        t0 = time.perf_counter()
        out = fn()
        self.durations.append(time.perf_counter() - t0)
        self.longest_transaction_s = max(self.longest_transaction_s, self.durations[-1])
        self.batches += 1
        pause = float(settings.GYMWEB_DELETE_PAUSE_S)
        if pause > 0:
            time.sleep(pause)
        return out


def _batch(batch: int | None) -> int:
    return max(1, int(batch or settings.GYMWEB_DELETE_BATCH))


def archive_dir(run: Run) -> Path:
    """The folder of the run's archive: ``GYMWEB_ARCHIVE_DIR/run-<id>``."""
    return Path(settings.GYMWEB_ARCHIVE_DIR or Path(settings.DATA_DIR) / "archive") / f"run-{run.pk}"


def shown_folder(run: Run, user: Any) -> str:
    """The run's archive folder as ``user`` may read it: the server's full path for staff, else only
    the folder's name (``run-12``, under the server's archive folder): the disks' layout is the
    operators' business. Empty when the run is not archived."""
    if not run.archive_path:
        return ""
    return run.archive_path if getattr(user, "is_staff", False) else Path(run.archive_path).name


def require_archived(run: Run) -> None:
    """Raise ``ArchiveError`` unless the run is archived (what a restore needs)."""
    if not run.is_archived:
        raise ArchiveError(f"run {run.pk} is not archived")


def require_items(run: Run, what: str = "this") -> None:
    """Raise ``RunArchived`` if the run's items are archived (``what`` names the request)."""
    if run.is_archived:
        raise RunArchived(run, what)


def download_refusal(run: Run, kind: str, filtered: bool, plain: bool) -> str | None:
    """Why a download of file ``kind`` (``rollouts``, ``rollouts_failures``, ...,  ``sft``) cannot be
    served while ``run`` is archived, or None: a filtered or curated ``rollouts.jsonl`` and the SFT
    export need the stored responses; the plain ``rollouts.jsonl`` comes from the archive (refused
    when its file does not match the manifest, or is missing) and the other files from the rows kept."""
    if run.is_archived and (kind == "sft" or (kind == "rollouts" and (filtered or not plain))):
        return str(RunArchived(run, f"a filtered or curated {kind}.jsonl" if kind == "rollouts" else "the SFT export"))
    if run.is_archived and kind == "rollouts":
        # Served from the archive file: checked whole first, so a damaged or missing file is this
        # refusal, not a short or empty download that looks complete.
        try:
            verify_file(run, "rollouts")
        except ArchiveError as exc:
            return f"run {run.pk}'s archived rollouts.jsonl cannot be served: {exc}"
    return None


def check_idle(run: Run, doing: str) -> None:
    """``RunBusy`` unless ``run`` may be ``doing`` ("deleted", "archived") now: final, and none of
    its rollouts in flight."""
    if not run.is_final:
        raise RunBusy(
            f"run {run.pk} is {run.status}: it cannot be {doing} while it is collected. "
            f"Cancel it first, then {doing.rstrip('d')} it."
        )
    active = Rollout.objects.filter(run=run, status__in=Rollout.ACTIVE).count()
    if active:
        raise RunBusy(
            f"run {run.pk} still has {active} rollout(s) in flight; try again when they have stopped "
            "(those of a worker that died end at the supervisor's first sweep after GYMWEB_LEASE_S)."
        )


def _items_cap() -> int:
    return max(1, int(settings.GYMWEB_DELETE_BATCH_ITEMS))


def _id_batches(qs, size: int, weight: str | None = None) -> Iterator[list[int]]:
    """The ids of ``qs`` in ascending batches of at most ``size``, each page read fresh (keyset
    paging). With ``weight`` (a count column, ``num_items``), a batch also ends once the weights
    reach ``GYMWEB_DELETE_BATCH_ITEMS`` (one heavy row still makes a batch of its own)."""
    last, cap = 0, _items_cap()
    while True:
        page = list(qs.filter(id__gt=last).order_by("id").values_list("id", weight or "id")[:size])
        if not page:
            return
        last = page[-1][0]
        if weight is None:
            yield [pk for pk, _ in page]
            continue
        batch, load = [], 0
        for pk, w in page:
            if batch and load + (w or 0) > cap:
                yield batch
                batch, load = [], 0
            batch.append(pk)
            load += w or 0
        if batch:
            yield batch


# -- delete -----------------------------------------------------------------------------------------
def delete_run(run: Run, *, batch: int | None = None, remove_archive: bool = True, unfinished: bool = False) -> Outcome:
    """Delete ``run`` with everything under it, ``batch`` rollouts (default ``GYMWEB_DELETE_BATCH``)
    per transaction, then its tasks, review lists and the run row; its archive folder too
    (``remove_archive``). Raises ``RunBusy`` for a run being collected, unless ``unfinished`` (a run
    whose upload or import stopped part-way: no worker ever took it). Returns the counts."""
    if not unfinished:
        check_idle(run, "deleted")
    size = _batch(batch)
    out = Outcome(run=run.pk, path=run.archive_path)
    t0 = time.perf_counter()
    for ids in _id_batches(Rollout.objects.filter(run=run), size, "num_items"):

        def one(ids=ids):
            with transaction.atomic():
                out.items += TrajectoryItem.objects.filter(rollout_id__in=ids).delete()[0]
                out.agent_calls += AgentCall.objects.filter(rollout_id__in=ids).delete()[0]
                # labels, notes, corrections, health, review marks: cascaded, a few rows each
                Rollout.objects.filter(id__in=ids).only("id").delete()

        out.timed(one)
        out.rollouts += len(ids)
    for ids in _id_batches(Task.objects.filter(run=run), size * 10):
        out.timed(lambda ids=ids: Task.objects.filter(id__in=ids).only("id").delete())
    for ids in _id_batches(ReviewList.objects.filter(run=run), size):
        out.timed(lambda ids=ids: ReviewList.objects.filter(id__in=ids).delete())
    out.timed(lambda: Run.objects.filter(pk=run.pk).delete())
    if remove_archive and run.archive_path:
        shutil.rmtree(run.archive_path, ignore_errors=True)
    out.seconds = time.perf_counter() - t0
    return out


# -- archive ----------------------------------------------------------------------------------------
class _Writer:
    """Lines into one zstd file; counts lines and hashes the uncompressed bytes."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = path.open("wb")
        self.stream = zstandard.ZstdCompressor(level=ZSTD_LEVEL).stream_writer(self.fh, closefd=False)
        self.sha = hashlib.sha256()
        self.lines = 0

    def write(self, line: str) -> None:
        data = line.encode("utf-8") + b"\n"
        self.sha.update(data)
        self.stream.write(data)
        self.lines += 1

    def close(self) -> dict[str, Any]:
        self.stream.close()
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        return {"lines": self.lines, "sha256": self.sha.hexdigest(), "bytes": self.path.stat().st_size}


_STAMPS = (ENVIRONMENT_SERVER_KEY, RESULT_TYPE_KEY)
_EXPORT_KEYS = (TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, "agent_ref", *_STAMPS)


def _verify_from_line(line: str, how: str) -> str:
    """The ``/verify`` reply a ``rollouts.jsonl`` line was made from (``export.success_row``), when
    ``how`` says what the export added: ``"line"`` nothing (an imported row), ``"unstamped"`` the
    stamps (a reply that echoed the indices and ``agent_ref``), ``"stripped"`` the indices,
    ``agent_ref`` and the stamps."""
    if how == "line":
        return line
    row = json.loads(line)
    for key in _STAMPS if how == "unstamped" else _EXPORT_KEYS:
        row.pop(key, None)
    return dumps(row)


def _response_output(rollout_status: str, verify: dict | None, partial_json: str) -> list:
    response = (
        (verify or {}).get("response")
        if rollout_status == Rollout.Status.SUCCEEDED
        else (json.loads(partial_json) if partial_json else None)
    )
    output = response.get("output") if isinstance(response, dict) else None
    return output if isinstance(output, list) else []


def _details(
    r: dict[str, Any], line: str | None, calls: list[dict[str, Any]], items: list[dict[str, Any]]
) -> dict[str, Any]:
    """One line of ``gymweb_details.jsonl``: what restoring rollout ``r`` needs beyond its
    ``rollouts.jsonl`` line. ``verify`` says how to get ``verify_json`` back from the line
    (``_verify_from_line``: ``"line"``, ``"unstamped"``, ``"stripped"``) or holds the text itself
    (``{"text": ...}``); an item's
    payload is left out (``"payload_in_output": true``) when it is the response's output item at its
    position, byte for byte."""
    verify = None
    verify_obj = None
    if r["status"] == Rollout.Status.SUCCEEDED:
        how = next(
            (
                h
                for h in ("line", "unstamped", "stripped")
                if line is not None and _verify_from_line(line, h) == r["verify_json"]
            ),
            None,
        )
        verify = how or {"text": r["verify_json"]}
        try:
            verify_obj = json.loads(r["verify_json"])
        except ValueError:
            verify_obj = None
    output = _response_output(
        r["status"], verify_obj if isinstance(verify_obj, dict) else None, r["partial_response_json"]
    )
    out_items = []
    for item in items:
        entry = {name: item[name] for name in _ITEM_FIELDS}
        text = dumps(item["payload"])
        if item["seq"] < len(output) and dumps(output[item["seq"]]) == text:
            entry["payload_in_output"] = True
        else:
            entry["payload"] = text
        out_items.append(entry)
    return {
        "rollout": r["id"],
        "task_index": r["task_index"],
        "rollout_index": r["rollout_index"],
        "status": r["status"],
        "verify": verify,
        "partial_response_json": r["partial_response_json"],
        # An imported run's agent calls have no recorded start (None).
        "agent_calls": [{**c, "started": c["started"].isoformat() if c["started"] else None} for c in calls],
        "items": out_items,
    }


def _write_details(run: Run, writer: _Writer, size: int) -> None:
    """Details of every rollout, in the order of ``rollouts.jsonl`` for the successes (task, rollout,
    attempt, id), each success checked against its exported line."""
    successes = export.iter_successes(run)
    fields = ("id", "task_index", "rollout_index", "status", "verify_json", "partial_response_json")
    fetch = Rollout.objects.filter(run=run).order_by("task_index", "rollout_index", "attempt", "id").values(*fields)
    chunk: list[dict[str, Any]] = []

    def flush():
        ids = [r["id"] for r in chunk]
        calls: dict[int, list] = {i: [] for i in ids}
        items: dict[int, list] = {i: [] for i in ids}
        for c in (
            AgentCall.objects.filter(rollout_id__in=ids)
            .order_by("rollout_id", "index")
            .values("rollout_id", "started", *_CALL_FIELDS)
        ):
            calls[c.pop("rollout_id")].append(c)
        for it in (
            TrajectoryItem.objects.filter(rollout_id__in=ids)
            .order_by("rollout_id", "seq")
            .values("rollout_id", "payload", *_ITEM_FIELDS)
        ):
            items[it.pop("rollout_id")].append(it)
        for r in chunk:
            line = next(successes) if r["status"] == Rollout.Status.SUCCEEDED else None
            writer.write(dumps(_details(r, line, calls[r["id"]], items[r["id"]])))
        chunk.clear()

    for r in fetch.iterator(chunk_size=size):
        chunk.append(r)
        if len(chunk) >= size:
            flush()
    if chunk:
        flush()
    if next(successes, None) is not None:
        raise ArchiveError(f"run {run.pk}: rollouts.jsonl has more rows than the run's successes")


def _write_files(run: Run, tmp: Path, size: int) -> dict[str, dict[str, Any]]:
    """Write the archive's files into the new folder ``tmp``; returns the manifest's ``files``."""
    tmp.mkdir(parents=True)
    files: dict[str, dict[str, Any]] = {}
    sources = {
        "rollouts": lambda: export.iter_successes(run),
        "rollouts_failures": lambda: export.iter_failures(run),
        "rollouts_materialized_inputs": lambda: export.iter_materialized(run),
    }
    for kind, lines in sources.items():
        writer = _Writer(tmp / FILES[kind])
        for line in lines():
            writer.write(line)
        files[FILES[kind]] = writer.close()
    writer = _Writer(tmp / FILES["details"])
    _write_details(run, writer, size)
    files[FILES["details"]] = writer.close()
    manifest = {
        "format": FORMAT,
        "run": run.pk,
        "name": run.name,
        "status": run.status,
        "archived": timezone.now().isoformat(),
        "files": files,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return files


def _drop(run: Run, size: int, out: Outcome) -> None:
    """Drop the archived run's items, agent calls and stored responses, ``size`` rollouts per
    transaction. A success without profile numbers gets them first (the profile page reads them)."""
    ordered = export.agent_ordered(run)
    for ids in _id_batches(Rollout.objects.filter(run=run), size, "num_items"):

        def one(ids=ids):
            with transaction.atomic():
                out.items += TrajectoryItem.objects.filter(rollout_id__in=ids).delete()[0]
                out.agent_calls += AgentCall.objects.filter(rollout_id__in=ids).delete()[0]
                missing = Rollout.objects.filter(id__in=ids, status=Rollout.Status.SUCCEEDED, profile_json="").exclude(
                    verify_json=""
                )
                for rid, verify_json in missing.values_list("id", "verify_json"):
                    verify = json.loads(verify_json)
                    numbers = profile_json_for_verify(agent_result(verify) if ordered else verify)
                    if numbers:
                        Rollout.objects.filter(id=rid).update(profile_json=numbers)
                Rollout.objects.filter(id__in=ids).update(verify_json="", partial_response_json="")

        out.timed(one)
        out.rollouts += len(ids)


def archive_run(run: Run, *, batch: int | None = None) -> Outcome:
    """Archive ``run`` (see the module doc). Raises ``RunBusy`` for a run being collected,
    ``ArchiveError`` when the folder cannot be written or does not read back as written (nothing is
    dropped then). Archiving an archived run again checks its files and finishes an interrupted
    drop, writing nothing."""
    check_idle(run, "archived")
    size = _batch(batch)
    out = Outcome(run=run.pk)
    t0 = time.perf_counter()
    run.refresh_from_db(fields=["archived", "archive_path"])
    if not run.is_archived:
        folder = archive_dir(run)
        if folder.exists() and not folder.is_dir():
            raise ArchiveError(
                f"cannot archive run {run.pk}: {folder.name} in the archive folder (GYMWEB_ARCHIVE_DIR) is a file, "
                "not this run's folder; move it away and archive again"
            )
        tmp = folder.with_name(f".{folder.name}.{uuid.uuid4().hex}.tmp")
        try:
            out.files = _write_files(run, tmp, size)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ArchiveError(
                f"cannot write the archive of run {run.pk} to {folder.name} in the archive folder "
                f"(GYMWEB_ARCHIVE_DIR): {why(exc)}"
            ) from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        # Marked only if nobody archived it meanwhile (two requests at once: one wins, the other's
        # files are thrown away before they could replace the winner's).
        when = timezone.now()
        marked = out.timed(
            lambda: Run.objects.filter(pk=run.pk, archived__isnull=True).update(archived=when, archive_path=str(folder))
        )
        if not marked:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ArchiveError(f"run {run.pk} was archived by another request meanwhile")
        try:
            if folder.is_dir():
                shutil.rmtree(folder)  # a folder left by an earlier attempt, never marked
            tmp.replace(folder)
        except OSError as exc:  # the run is not left marked with no files: unmarked, as it was
            Run.objects.filter(pk=run.pk).update(archived=None, archive_path="")
            shutil.rmtree(tmp, ignore_errors=True)
            raise ArchiveError(
                f"cannot put the archive of run {run.pk} in place as {folder.name} in the archive folder: "
                f"{why(exc)}; nothing was dropped"
            ) from exc
        run.archived, run.archive_path = when, str(folder)
    out.path = run.archive_path
    verify_files(run)  # nothing is dropped unless the files read back as written
    _drop(run, size, out)
    out.timed(lambda: _forget(run))  # the run table's kept field values read the dropped replies
    out.seconds = time.perf_counter() - t0
    return out


def _forget(run: Run) -> None:
    with transaction.atomic():
        forget_field_values(run.pk)


# -- reading and restoring --------------------------------------------------------------------------
def _manifest(run: Run) -> dict[str, Any]:
    folder = Path(run.archive_path or archive_dir(run))
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"run {run.pk}: cannot read {shown(path)}: {why(exc)}") from exc
    if manifest.get("format") != FORMAT or manifest.get("run") != run.pk:
        raise ArchiveError(
            f"{shown(path)} is not the archive of run {run.pk} "
            f"(format {manifest.get('format')!r}, run {manifest.get('run')!r})"
        )
    return manifest


def _check_file(run: Run, path: Path, expected: dict[str, Any]) -> None:
    """Raise ``ArchiveError`` unless ``path`` decompresses to the manifest's lines and SHA-256."""
    sha, lines = hashlib.sha256(), 0
    try:
        for line in read_lines(path):
            sha.update(line.encode("utf-8") + b"\n")
            lines += 1
    except (OSError, zstandard.ZstdError, UnicodeDecodeError) as exc:
        raise ArchiveError(f"run {run.pk}: cannot read {shown(path)}: {why(exc)}") from exc
    if lines != expected["lines"]:
        raise ArchiveError(
            f"run {run.pk}: {shown(path)} does not match its manifest "
            f"({lines} lines read, {expected['lines']} expected)"
        )
    if sha.hexdigest() != expected["sha256"]:
        raise ArchiveError(
            f"run {run.pk}: {shown(path)} does not match its manifest: its {lines} lines are there, "
            "but their content differs (SHA-256)"
        )


def verify_files(run: Run) -> dict[str, Any]:
    """Check every archive file against the manifest (line count and SHA-256 of the decompressed
    bytes). Returns the manifest; raises ``ArchiveError`` naming the first file that differs."""
    manifest = _manifest(run)
    folder = Path(run.archive_path)
    for name, expected in manifest["files"].items():
        _check_file(run, folder / name, expected)
    return manifest


def verify_file(run: Run, kind: str) -> None:
    """Check the archive's file ``kind`` (``"rollouts"``...) against the manifest, as
    ``verify_files`` does for all; raises ``ArchiveError``."""
    manifest = _manifest(run)
    name = FILES[kind]
    if name not in manifest["files"]:
        raise ArchiveError(f"run {run.pk}: the archive's manifest lists no {name}")
    _check_file(run, Path(run.archive_path) / name, manifest["files"][name])


def _restore_chunk(chunk: list[tuple[dict[str, Any], str | None]], out: Outcome) -> None:
    ids = [d["rollout"] for d, _ in chunk]
    existing = set(Rollout.objects.filter(id__in=ids).values_list("id", flat=True))
    calls, items, updates = [], [], []
    for d, line in chunk:
        rid = d["rollout"]
        if rid not in existing:
            raise ArchiveError(
                f"rollout {rid} of the archive is not in the database; nothing of this batch was restored"
            )
        verify = d["verify"]
        verify_json = (
            "" if verify is None else verify["text"] if isinstance(verify, dict) else _verify_from_line(line, verify)
        )
        verify_obj = json.loads(verify_json) if verify_json else None
        output = _response_output(
            d["status"], verify_obj if isinstance(verify_obj, dict) else None, d["partial_response_json"]
        )
        for c in d["agent_calls"]:
            calls.append(
                AgentCall(
                    rollout_id=rid,
                    started=datetime.fromisoformat(c["started"]) if c["started"] else None,
                    **{k: c[k] for k in _CALL_FIELDS},
                )
            )
        for it in d["items"]:
            payload = output[it["seq"]] if it.get("payload_in_output") else json.loads(it["payload"])
            items.append(TrajectoryItem(rollout_id=rid, payload=payload, **{k: it[k] for k in _ITEM_FIELDS}))
        updates.append((rid, verify_json, d["partial_response_json"]))
    fill_missing(items)  # the content search's text, computed before the write lock is taken
    updates = [u for u in updates if u[1] or u[2]]
    meta, qn = Rollout._meta, connection.ops.quote_name
    update_sql = "UPDATE %s SET %s = %%s, %s = %%s WHERE %s = %%s" % (
        qn(meta.db_table),
        qn(meta.get_field("verify_json").column),
        qn(meta.get_field("partial_response_json").column),
        qn(meta.pk.column),
    )

    def write():
        with transaction.atomic():
            TrajectoryItem.objects.filter(rollout_id__in=ids).delete()
            AgentCall.objects.filter(rollout_id__in=ids).delete()
            # the dispatcher's insert (one executemany, values prepared as bulk_create would)
            insert_ignoring_conflicts(AgentCall, calls)
            insert_ignoring_conflicts(TrajectoryItem, items)
            if updates:
                with connection.cursor() as cursor:
                    cursor.executemany(update_sql, [(v, p, rid) for rid, v, p in updates])

    out.timed(write)
    out.rollouts += len(chunk)
    out.items += len(items)
    out.agent_calls += len(calls)


def restore_run(run: Run, *, batch: int | None = None, keep_files: bool = False) -> Outcome:
    """Bring an archived run's items back from its archive (checked against the manifest first;
    ``ArchiveError`` and nothing changed if a file differs), ``batch`` rollouts per transaction,
    then mark it not archived and remove the files (unless ``keep_files``). Raises ``ArchiveError``
    if the run is not archived."""
    run.refresh_from_db(fields=["archived", "archive_path"])
    require_archived(run)
    verify_files(run)
    size = _batch(batch)
    out = Outcome(run=run.pk, path=run.archive_path)
    t0 = time.perf_counter()
    folder = Path(run.archive_path)
    try:
        _restore_files(run, folder, size, out)
    except OSError as exc:
        raise ArchiveError(
            f"run {run.pk}: reading {folder.name} failed while restoring ({why(exc)}); run the restore again"
        ) from exc
    out.timed(lambda: Run.objects.filter(pk=run.pk).update(archived=None, archive_path=""))
    out.timed(lambda: _forget(run))  # kept field values read while it was archived: without replies
    run.archived, run.archive_path = None, ""
    if not keep_files:
        shutil.rmtree(folder, ignore_errors=True)
    out.seconds = time.perf_counter() - t0
    return out


def _restore_files(run: Run, folder: Path, size: int, out: Outcome) -> None:
    successes = archived_lines(run, "rollouts")
    chunk: list[tuple[dict[str, Any], str | None]] = []
    cap, load = _items_cap(), 0
    for text in read_lines(folder / FILES["details"]):
        d = json.loads(text)
        line = next(successes) if d["status"] == Rollout.Status.SUCCEEDED else None
        if chunk and (len(chunk) >= size or load + len(d["items"]) > cap):
            _restore_chunk(chunk, out)
            chunk, load = [], 0
        chunk.append((d, line))
        load += len(d["items"])
    if chunk:
        _restore_chunk(chunk, out)


# -- prune ------------------------------------------------------------------------------------------
def parse_age(text: str) -> timedelta:
    """``prune --older-than``: ``durations.parse_duration`` (``"30d"`` → 30 days); its
    ``ValueError`` names the option."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ValueError(f"--older-than {exc}") from None


def prune_candidates(older_than: timedelta, *, archive: bool, now: datetime | None = None) -> list[Run]:
    """Final runs finished (or, never started, created) more than ``older_than`` ago, oldest first;
    with ``archive``, only those not archived yet."""
    cutoff = (now or timezone.now()) - older_than
    from django.db.models import Q

    qs = Run.objects.filter(status__in=Run.FINAL).filter(
        Q(finished__lt=cutoff) | Q(finished__isnull=True, created__lt=cutoff)
    )
    if archive:
        qs = qs.filter(archived__isnull=True)
    return list(qs.order_by("created", "id"))


def prune(
    older_than: timedelta,
    *,
    archive: bool = False,
    batch: int | None = None,
    dry_run: bool = False,
    log: Callable[[str], None] | None = None,
) -> list[Outcome]:
    """Delete (or, ``archive``, archive) every final run older than ``older_than``; runs in flight
    are never touched. Returns one ``Outcome`` per run done (none with ``dry_run``)."""
    done = []
    for run in prune_candidates(older_than, archive=archive):
        if log:
            log(f"{'would ' if dry_run else ''}{'archive' if archive else 'delete'} run {run.pk} ({run.name})")
        if dry_run:
            continue
        try:
            done.append(archive_run(run, batch=batch) if archive else delete_run(run, batch=batch))
        except RunBusy as exc:
            if log:
                log(f"skipped: {exc}")
    return done
