"""What the loop saw is what gets stored, shown and exported, byte for byte, on SQLite and on
PostgreSQL: through a worker process, through ``manage.py collect`` and through an import.

The corpus (``tests/corpus.py``) puts U+0000 in values and keys, every control character,
U+2028/U+2029, astral characters, gymweb's own escape character, a 1 MB string, nesting 500 deep,
huge and tiny numbers, ``-0.0`` and 100-bit integers into task rows, agent replies (items, call
ids, arguments, usage extra keys, incomplete_details), a binary-looking tool output, the verify
reply, an agent error body and /aggregate_metrics. The oracle is the loop itself, run directly
(no Django) against the same deterministic services: each exported line must equal
``json.dumps(row, ensure_ascii=False)`` of the row it implies, and every stored part must equal what
the loop reported. ``.ci/run`` runs this file on both backends (the whole suite runs twice).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse

from gymweb.examples._serve import BackgroundServer
from rollouts.collection import export, runs
from rollouts.collection.datasets import materialize, read_jsonl
from rollouts.collection.importer import import_rollouts
from rollouts.collection.stamps import stamp
from rollouts.engine.http import make_client
from rollouts.engine.loop import run_rollout
from rollouts.engine.nemo_request import agent_result
from rollouts.models import AgentCall, Rollout, Run, TrajectoryItem
from tests.servers import LOCAL

from . import corpus
from .conftest import wait_for
from .servers import RecordingObserver
from .servers import settings as loop_settings

pytestmark = pytest.mark.django_db(transaction=True)


def canon(value: Any) -> str:
    """The one spelling of a JSON value that tells ``-0.0`` from ``0``, ``1.0`` from ``1`` and keeps key
    order: ``json.dumps`` as the exports write it. Python's ``==`` would miss all three."""
    return json.dumps(value, ensure_ascii=False)


@pytest.fixture(scope="module")
def services():
    agent = BackgroundServer(corpus.make_agent()).start()
    env = BackgroundServer(corpus.make_env()).start()
    yield agent.url, env.url
    agent.stop()
    env.stop()


@pytest.fixture(scope="module")
def oracle(services, tmp_path_factory):
    """The loop's own view of every key: ``{(task, rollout): (materialised row, outcome, observer)}``
    and the files that view implies (``{"rollouts": [lines], "failures": [...], "materialized": [...]}``)."""
    agent_url, env_url = services
    path = tmp_path_factory.mktemp("corpus") / "corpus_tasks.jsonl"
    path.write_text(corpus.dataset_text(), encoding="utf-8")
    with path.open("rb") as fh:
        tasks = materialize(read_jsonl(fh), agent_name="remote_agent")

    async def run_all():
        client = make_client(4, policy=LOCAL)
        try:
            out = {}
            for task in tasks:
                for rollout_index in task.rollout_indices:
                    row = task.rollout_row(rollout_index)
                    observer = RecordingObserver()
                    outcome = await run_rollout(client, row, loop_settings(agent_url, env_url), observer)
                    out[(task.task_index, rollout_index)] = (row, outcome, observer)
            return out
        finally:
            await client.aclose()

    keys = asyncio.run(run_all())
    files = {"rollouts": [], "failures": [], "materialized": []}
    for (task_index, rollout_index), (row, outcome, _) in sorted(keys.items()):
        files["materialized"].append(export.row_line(row))  # the files' writer: NeMo Gym's bytes
        if outcome.ok:
            line = agent_result(dict(outcome.verify_response))  # as NeMo Gym's agent returns it
            line["_ng_task_index"], line["_ng_rollout_index"], line["agent_ref"] = (
                task_index,
                rollout_index,
                row["agent_ref"],
            )
            files["rollouts"].append(
                export.row_line(stamp(line, row["agent_ref"], add=True))
            )  # NeMo Gym's two stamps, last
        else:
            task_row = {k: v for k, v in row.items() if k != "_ng_rollout_index"}
            files["failures"].append(
                export.row_line(
                    export.failure_row(
                        task_row,
                        rollout_index,
                        export.sidecar_error(outcome.error, outcome.nemo_error or ""),
                        outcome.terminal,
                    )
                )
            )
    outcomes = [o for _, o, _ in keys.values()]
    # The corpus reaches the loop as intended: two successes and one failure, all of them awkward.
    assert [o.ok for o in outcomes] == [True, True, False], [o.error for o in outcomes]
    assert "\x00" in outcomes[2].error and outcomes[2].failure_kind == "agent_http_error"
    assert any("\\u0000" in canon(i.item) for i in keys[(0, 0)][2].items)
    return {"path": path, "keys": keys, "files": files}


def _split(text: str) -> list[str]:
    """JSONL lines: split at "\n" only. ``str.splitlines`` would also split inside a JSON string at
    U+2028, U+2029, U+0085 and other characters that JSON leaves unescaped."""
    assert text.endswith("\n") or not text
    return text.split("\n")[:-1]


def _lines(path: Path) -> list[str]:
    return _split(path.read_text(encoding="utf-8"))


def _check_stored(run: Run, oracle) -> None:
    """Every stored part of every key equals what the loop reported (read back through the ORM,
    as every page and export reads it)."""
    for (task_index, rollout_index), (_row, outcome, observer) in oracle["keys"].items():
        rollout = Rollout.objects.get(run=run, task_index=task_index, rollout_index=rollout_index)
        assert rollout.status == ("succeeded" if outcome.ok else "failed")
        assert rollout.storage_error == "" and rollout.failure_kind == (outcome.failure_kind or "")
        assert rollout.error == (outcome.error or "") and rollout.nemo_error == (outcome.nemo_error or "")
        assert rollout.warnings == outcome.warnings
        items = list(TrajectoryItem.objects.filter(rollout=rollout).order_by("seq"))
        assert [canon(i.payload) for i in items] == [canon(r.item) for r in observer.items]
        assert [(i.call_id, i.name) for i in items] == [
            (str(r.item.get("call_id") or ""), str(r.item.get("name") or "")) for r in observer.items
        ]
        calls = list(AgentCall.objects.filter(rollout=rollout).order_by("index"))
        assert [(c.response_id, c.model, canon(c.usage), canon(c.incomplete_details), c.error) for c in calls] == [
            (s.response_id or "", s.model or "", canon(s.usage), canon(s.incomplete_details), s.error or "")
            for s in observer.steps
        ]
        if not outcome.ok and outcome.response is not None:
            assert rollout.partial_response_json == canon(outcome.response)


def _check_pages(client, run: Run, oracle) -> None:
    """Every page that reads the run answers, and the raw JSON views give the stored values."""
    for name, args in (("run", [run.pk]), ("run_profile", [run.pk]), ("run_charts", [run.pk])):
        assert client.get(reverse(name, args=args)).status_code == 200, name
    for task_index in sorted({k[0] for k in oracle["keys"]}):
        assert client.get(reverse("compare") + f"?a={run.pk}&b={run.pk}&task={task_index}").status_code == 200
    expected = {
        **{json.loads(line)["_ng_task_index"]: line for line in oracle["files"]["rollouts"]},
        **{json.loads(line)["_ng_task_index"]: line for line in oracle["files"]["failures"]},
    }
    rollouts = list(Rollout.objects.filter(run=run))
    assert len(rollouts) == len(oracle["keys"])
    for rollout in rollouts:
        page = client.get(reverse("rollout", args=[run.pk, rollout.pk]))
        assert page.status_code == 200
        raw = client.get(reverse("rollout_raw", args=[run.pk, rollout.pk]))
        assert export.row_line(json.loads(raw.content)) == expected[rollout.task_index]
        for item in TrajectoryItem.objects.filter(rollout=rollout):
            one = client.get(reverse("rollout_raw", args=[run.pk, rollout.pk]) + f"?item={item.seq}")
            assert canon(json.loads(one.content)) == canon(item.payload)


def _stored_aggregate() -> dict:
    """What a run keeps of the env's /aggregate_metrics reply: the entry of NeMo Gym's
    ``*_aggregate_metrics.json`` it makes (``evaluation.run_aggregate_metrics``), every value exactly as sent."""
    reply = corpus.aggregate_reply()
    return {
        "agent_ref": {"name": "remote_agent"},
        "_ng_environment_server": "remote_agent_environment_server",
        "agent_metrics": reply["agent_metrics"],
        "key_metrics": reply["key_metrics"],
        "group_level_metrics": reply["group_level_metrics"],
        "repeat_level_metrics": [],
    }


def _downloads(client, run: Run) -> dict[str, list[str]]:
    out = {}
    for key, kind in (
        ("rollouts", "rollouts"),
        ("failures", "rollouts_failures"),
        ("materialized", "rollouts_materialized_inputs"),
    ):
        response = client.get(reverse("run_export", args=[run.pk, kind]))
        assert response.status_code == 200
        out[key] = _split(b"".join(response.streaming_content).decode("utf-8"))
    return out


@pytest.mark.slow
def test_the_cli_writes_and_stores_exactly_what_the_loop_saw(services, oracle, tmp_path, signed_in):
    agent_url, env_url = services
    out = tmp_path / "results" / "rollouts.jsonl"
    call_command(
        "collect",
        "--agent-url",
        agent_url,
        "--env-url",
        env_url,
        "--input",
        str(oracle["path"]),
        "--output",
        str(out),
        "--no-progress",
    )
    names = export.output_stems(out)
    assert _lines(names["rollouts"]) == oracle["files"]["rollouts"]
    assert _lines(names["failures"]) == oracle["files"]["failures"]
    assert _lines(names["materialized"]) == oracle["files"]["materialized"]
    run = Run.objects.get()
    _check_stored(run, oracle)
    assert _downloads(signed_in, run) == oracle["files"]
    assert canon(run.aggregate_metrics) == canon(_stored_aggregate())
    _check_pages(signed_in, run, oracle)


def test_a_worker_process_stores_exactly_what_the_loop_saw(services, oracle, workers, signed_in):
    agent_url, env_url = services
    with oracle["path"].open("rb") as fh:
        parsed = read_jsonl(fh, source="corpus_tasks.jsonl")
    dataset = runs.store_dataset(parsed, "corpus \x00 tasks.jsonl")
    run = runs.create_run(
        runs.load_dataset(dataset), name="corpus \x00 run", dataset=dataset, agent_url=agent_url, env_url=env_url
    )
    runs.launch(run)
    workers.start(workers=1)
    wait_for(
        lambda: Run.objects.get(pk=run.pk).aggregate_metrics is not None, 120, what="the run and its aggregate metrics"
    )
    run.refresh_from_db()
    assert (
        run.status == Run.Status.COMPLETED
        and run.name == "corpus \x00 run"
        and run.dataset.name == "corpus \x00 tasks.jsonl"
    )
    _check_stored(run, oracle)
    assert _downloads(signed_in, run) == oracle["files"]
    assert canon(run.aggregate_metrics) == canon(_stored_aggregate())
    _check_pages(signed_in, run, oracle)


@pytest.mark.slow
def test_importing_the_files_and_exporting_them_gives_the_same_bytes(oracle, tmp_path, signed_in):
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "rollouts.jsonl").write_text("".join(l + "\n" for l in oracle["files"]["rollouts"]), encoding="utf-8")
    (folder / "rollouts_failures.jsonl").write_text(
        "".join(l + "\n" for l in oracle["files"]["failures"]), encoding="utf-8"
    )
    with (folder / "rollouts.jsonl").open("rb") as main, (folder / "rollouts_failures.jsonl").open("rb") as side:
        run = import_rollouts(
            main,
            failures=side,
            source=str(folder / "rollouts.jsonl"),
            failures_source=str(folder / "rollouts_failures.jsonl"),
        ).run
    assert list(export.iter_successes(run)) == oracle["files"]["rollouts"]
    assert list(export.iter_failures(run)) == oracle["files"]["failures"]
    # The imported trajectory is the file's merged response.output, item for item.
    for line in oracle["files"]["rollouts"]:
        row = json.loads(line)
        rollout = Rollout.objects.get(run=run, task_index=row["_ng_task_index"])
        assert [canon(i.payload) for i in rollout.items.order_by("seq")] == [
            canon(i) for i in row["response"]["output"]
        ]
    _check_pages(signed_in, run, oracle)
    # The same through the web form.
    with (folder / "rollouts.jsonl").open("rb") as main, (folder / "rollouts_failures.jsonl").open("rb") as side:
        response = signed_in.post(reverse("import"), {"rollouts": main, "failures": side})
    assert response.status_code == 302
    web_run = Run.objects.exclude(pk=run.pk).get()
    assert _downloads(signed_in, web_run)["rollouts"] == oracle["files"]["rollouts"]
    assert _downloads(signed_in, web_run)["failures"] == oracle["files"]["failures"]


def test_a_hand_written_file_with_nul_in_keys_and_values_imports_and_exports_byte_for_byte(tmp_path):
    rows = []
    for i in range(3):
        rows.append(
            {
                "responses_create_params": {"input": [{"role": "user", "content": f"\x00 {i}"}]},
                "response": {
                    "id": "r\x00",
                    "object": "response",
                    "model": "\x00",
                    "output": [
                        {
                            "type": "message",
                            "id": "m",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": corpus.AWKWARD, "annotations": []}],
                            "\x00k": corpus.corpus(big=i == 0),
                        }
                    ],
                    "usage": None,
                    "incomplete_details": {"reason": "\x00", "n": -0.0},
                },
                "reward": [-0.0, 1.0, 0.5][i],
                "\x00": corpus.NUMBERS,
                "_ng_task_index": i,
                "_ng_rollout_index": 0,
                "agent_ref": {"name": "agent \x00 name"},
            }
        )
    lines = [canon(r) for r in rows]
    path = tmp_path / "awkward.jsonl"
    path.write_text("".join(l + "\n" for l in lines), encoding="utf-8")
    with path.open("rb") as fh:
        run = import_rollouts(fh, source=str(path)).run
    assert list(export.iter_successes(run)) == lines
    assert run.agent_name == "agent \x00 name" and run.name == "awkward.jsonl"
    call = AgentCall.objects.get(rollout__run=run, rollout__task_index=0)
    assert (call.response_id, call.model, canon(call.incomplete_details)) == (
        "r\x00",
        "\x00",
        '{"reason": "\\u0000", "n": -0.0}',
    )
