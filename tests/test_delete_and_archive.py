"""Delete, archive and restore runs (rollouts.collection.archive): the functions, the commands, the
API and the pages. Runs are collected for real against the example env and agent (or imported from
NeMo Gym's own files), so the round trip covers items, agent calls and stored responses as the
worker writes them."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from rollouts.collection import archive, export
from rollouts.collection.importer import import_rollouts
from rollouts.models import (
    AgentCall,
    Label,
    Note,
    RewardCorrection,
    Rollout,
    RolloutLabel,
    Run,
    Task,
    TrajectoryItem,
)
from rollouts.tokens import create_token
from tests.run_factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ("rollouts", "rollouts_failures", "rollouts_materialized_inputs")


@pytest.fixture(autouse=True)
def _archive_dir(settings, tmp_path):
    settings.GYMWEB_ARCHIVE_DIR = tmp_path / "archive"
    settings.GYMWEB_DELETE_BATCH = 3  # several batches even for small runs
    settings.GYMWEB_DELETE_PAUSE_S = 0
    return settings.GYMWEB_ARCHIVE_DIR


def _collect(tmp_path, agent_url, env_url, tasks, name, *extra):
    out = tmp_path / name / "rollouts.jsonl"
    call_command(
        "collect",
        "--agent-url",
        agent_url,
        "--env-url",
        env_url,
        "--input",
        str(tasks),
        "--output",
        str(out),
        "--no-progress",
        "--name",
        name,
        *extra,
    )
    return Run.objects.get(name=name)


@pytest.fixture
def collected(tmp_path, counter_env_url, counter_agent_url, counter_tasks_path):
    """A collected run with successes (2 repeats of 5 tasks) and one with failures (agent down)."""
    good = _collect(tmp_path, counter_agent_url, counter_env_url, counter_tasks_path, "good", "--num-repeats", "2")
    bad = _collect(tmp_path, "http://127.0.0.1:9", counter_env_url, counter_tasks_path, "bad", "--limit", "2")
    return good, bad


def _files(run) -> dict[str, bytes]:
    """The run's three downloads, as the run page serves them (unfiltered)."""
    out = {}
    lines = {
        "rollouts": export.iter_successes,
        "rollouts_failures": export.iter_failures,
        "rollouts_materialized_inputs": export.iter_materialized,
    }
    for kind, fn in lines.items():
        out[kind] = "".join(line + "\n" for line in fn(Run.objects.get(pk=run.pk))).encode()
    return out


def _page_files(client, run) -> dict[str, bytes]:
    out = {}
    for kind in KINDS:
        response = client.get(reverse("run_export", args=[run.pk, kind]))
        assert response.status_code == 200, kind
        out[kind] = b"".join(response.streaming_content)
    return out


def _snapshot(run):
    """Everything archiving drops, per rollout, as comparable values."""
    rows = {}
    for r in Rollout.objects.filter(run=run).order_by("id"):
        rows[r.pk] = (
            r.verify_json,
            r.partial_response_json,
            [
                (
                    c.index,
                    c.started,
                    c.latency_ms,
                    c.http_status,
                    c.response_id,
                    c.model,
                    c.usage,
                    c.incomplete_details,
                    c.num_asks,
                    c.error,
                )
                for c in AgentCall.objects.filter(rollout=r).order_by("index")
            ],
            [
                (
                    i.seq,
                    i.step,
                    i.kind,
                    i.role,
                    i.call_id,
                    i.name,
                    i.origin,
                    i.asked,
                    i.paired,
                    i.refused,
                    i.latency_ms,
                    i.tool_status,
                    json.dumps(i.payload),
                    i.search_text,
                )
                for i in TrajectoryItem.objects.filter(rollout=r).order_by("seq")
            ],
        )
    return rows


def _review(run, user=None):
    """A label, a note and a correction on the run's first success."""
    r = Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).order_by("id").first()
    label = Label.objects.get(name="good", team_id=run.team_id)
    RolloutLabel.objects.create(rollout=r, label=label, created_by=user)
    Note.objects.create(rollout=r, item_seq=1, text="look here", created_by=user)
    RewardCorrection.objects.create(rollout=r, reward=0.5, reason="half right", created_by=user)
    return r


# -- archive and restore ----------------------------------------------------------------------------
def test_archive_and_restore_give_back_every_file_byte_for_byte_and_every_item(collected, _archive_dir, signed_in):
    good, bad = collected
    for run in (good, bad):
        assert Rollout.objects.filter(run=run).count() > 0
    assert TrajectoryItem.objects.filter(rollout__run=good).count() > 0
    assert (
        AgentCall.objects.filter(rollout__run=bad).count() > 0
        or Rollout.objects.filter(run=bad, status="failed").count() > 0
    )
    _review(good)
    before = {run.pk: _files(run) for run in (good, bad)}
    pages_before = {run.pk: _page_files(signed_in, run) for run in (good, bad)}
    assert before[good.pk]["rollouts"].count(b"\n") == 10 and before[bad.pk]["rollouts_failures"].count(b"\n") == 2
    snap = {run.pk: _snapshot(run) for run in (good, bad)}
    other_items = TrajectoryItem.objects.filter(rollout__run=bad).count()

    out = archive.archive_run(good)
    good.refresh_from_db()
    assert good.is_archived and good.archive_path == str(_archive_dir / f"run-{good.pk}")
    assert out.batches > 1 and out.rollouts == 10
    # the items and responses left the database; the numbers, labels and corrections stayed
    assert TrajectoryItem.objects.filter(rollout__run=good).count() == 0
    assert AgentCall.objects.filter(rollout__run=good).count() == 0
    assert not Rollout.objects.filter(run=good).exclude(verify_json="").exists()
    assert Rollout.objects.filter(run=good, status="succeeded", reward=1.0).count() == 10
    assert RolloutLabel.objects.filter(rollout__run=good).count() == 1
    assert RewardCorrection.objects.filter(rollout__run=good).count() == 1
    assert TrajectoryItem.objects.filter(rollout__run=bad).count() == other_items  # the other run untouched
    names = sorted(p.name for p in (_archive_dir / f"run-{good.pk}").iterdir())
    assert names == sorted([*archive.FILES.values(), "manifest.json"])
    # downloads while archived: the same bytes (rollouts.jsonl from the archive, the rest from the rows kept)
    assert _page_files(signed_in, good) == pages_before[good.pk]
    assert pages_before[good.pk] == before[good.pk]

    out = archive.restore_run(good)
    good.refresh_from_db()
    assert not good.is_archived and good.archive_path == ""
    assert not (_archive_dir / f"run-{good.pk}").exists()
    assert out.rollouts == 10 and out.items > 0
    assert _snapshot(good) == snap[good.pk]
    assert _files(good) == before[good.pk]
    assert _page_files(signed_in, good) == before[good.pk]

    archive.archive_run(bad)
    archive.restore_run(Run.objects.get(pk=bad.pk))
    assert _snapshot(bad) == snap[bad.pk] and _files(bad) == before[bad.pk]


def test_round_trip_keeps_what_the_export_cannot_give_back(collected):
    """A verify reply that carries fields the export overwrites, an item that is not the response's
    output item at its position, and a failure's partial response: all come back exactly."""
    good, bad = collected
    successes = list(Rollout.objects.filter(run=good, status="succeeded").order_by("id"))
    assert len(successes) == 10
    odd = successes[0]
    verify = json.loads(odd.verify_json)
    verify["agent_ref"] = {"name": "someone else"}  # export.success_row replaces it in place
    verify["_ng_rollout_index"] = 99
    Rollout.objects.filter(pk=odd.pk).update(verify_json=json.dumps(verify, indent=1))
    item = TrajectoryItem.objects.filter(rollout=successes[1]).order_by("seq").first()
    item.payload = {**item.payload, "extra": "not in the response", "nul": "a\x00b", "neg": -0.0}
    item.search_text = ""  # recomputed from the new payload on save
    item.save()
    Rollout.objects.filter(run=bad, status="failed").update(
        partial_response_json=json.dumps({"output": [{"type": "message"}]})
    )
    snap = {run.pk: _snapshot(run) for run in (good, bad)}
    before = {run.pk: _files(run) for run in (good, bad)}
    for run in (good, bad):
        archive.archive_run(run)
        assert not Rollout.objects.filter(run=run).exclude(verify_json="", partial_response_json="").exists()
        if run == good:  # the odd ones were written whole; the others by reference to rollouts.jsonl
            details = [
                json.loads(line) for line in archive.read_lines(archive.archive_dir(run) / archive.FILES["details"])
            ]
            assert len(details) == 10
            # A reply the export reorders (the counter env echoes the task's fields before NeMo
            # Gym's, the row has NeMo Gym's order) cannot be read back from its line: kept whole.
            assert odd.pk in {d["rollout"] for d in details if isinstance(d["verify"], dict)}
            assert all(
                isinstance(d["verify"], dict) or d["verify"] in ("line", "unstamped", "stripped") for d in details
            )
            # Items equal to their place in the stored response are kept by reference; the changed
            # one is always kept whole (the response /verify got is NeMo Gym's dump of the items,
            # which may differ from the items as the agent sent them: then those are whole too).
            whole = [(d["rollout"], i["seq"]) for d in details for i in d["items"] if "payload" in i]
            assert (successes[1].pk, item.seq) in whole
        archive.restore_run(Run.objects.get(pk=run.pk))
        assert _snapshot(run) == snap[run.pk]
        assert _files(run) == before[run.pk]


def test_an_imported_nemo_gym_file_round_trips_byte_for_byte(shared_data):
    path = shared_data / "example_tool_call_multireward" / "example_rollouts.jsonl"
    summary = import_rollouts(path.open("rb"), source="rollouts.jsonl")
    run = summary.run
    before, snap = _files(run), _snapshot(run)
    assert before["rollouts"].count(b"\n") == sum(1 for line in path.open("rb") if line.strip()) > 0
    archive.archive_run(run)
    run.refresh_from_db()
    assert TrajectoryItem.objects.filter(rollout__run=run).count() == 0
    assert "".join(line + "\n" for line in archive.archived_lines(run, "rollouts")).encode() == before["rollouts"]
    archive.restore_run(run)
    assert _snapshot(run) == snap and _files(run) == before


def test_archiving_twice_from_stale_objects_writes_once_and_loses_nothing(collected, _archive_dir):
    good, _ = collected
    stale = Run.objects.get(pk=good.pk)
    before, snap = _files(good), _snapshot(good)
    archive.archive_run(good)
    out = archive.archive_run(stale)  # a second request that loaded the run before the first archived it
    assert out.files == {} and stale.is_archived
    assert [p.name for p in _archive_dir.iterdir()] == [f"run-{good.pk}"]  # no temporary folder left
    archive.restore_run(Run.objects.get(pk=good.pk))
    assert _snapshot(good) == snap and _files(good) == before


def test_restore_refuses_a_damaged_archive_and_changes_nothing(collected):
    good, _ = collected
    archive.archive_run(good)
    good.refresh_from_db()
    details = archive.archive_dir(good) / archive.FILES["details"]
    import zstandard

    details.write_bytes(zstandard.ZstdCompressor().compress(b'{"rollout": 1}\n'))
    with pytest.raises(archive.ArchiveError, match="gymweb_details.jsonl.zst does not match its manifest"):
        archive.restore_run(good)
    good.refresh_from_db()
    assert good.is_archived and TrajectoryItem.objects.filter(rollout__run=good).count() == 0


def test_a_file_in_the_way_of_the_archive_folder_is_refused_and_the_run_left_as_it_was(collected, _archive_dir):
    good, _ = collected
    items = TrajectoryItem.objects.filter(rollout__run=good).count()
    _archive_dir.mkdir(parents=True, exist_ok=True)
    (_archive_dir / f"run-{good.pk}").write_text("x")
    with pytest.raises(archive.ArchiveError, match=f"run-{good.pk} in the archive folder .* is a file"):
        archive.archive_run(good)
    good.refresh_from_db()
    assert not good.is_archived and TrajectoryItem.objects.filter(rollout__run=good).count() == items
    assert sorted(p.name for p in _archive_dir.iterdir()) == [f"run-{good.pk}"]  # no temporary folder left
    (_archive_dir / f"run-{good.pk}").unlink()
    assert archive.archive_run(good).items == items  # once it is moved away


@pytest.mark.parametrize("damage", ["truncated", "removed"])
def test_an_archived_runs_damaged_file_is_refused_not_served_short(collected, signed_in, user, damage):
    good, _ = collected
    archive.archive_run(good)
    good.refresh_from_db()
    whole = archive.archive_dir(good) / archive.FILES["rollouts"]
    if damage == "truncated":
        whole.write_bytes(whole.read_bytes()[:40])
    else:
        whole.unlink()
    page = signed_in.get(reverse("run_export", args=[good.pk, "rollouts"]))
    assert page.status_code == 409 and "cannot be served" in page.content.decode()
    _row, token = create_token(user, "t")
    api = signed_in.get(f"/api/v1/runs/{good.pk}/rollouts.jsonl", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api.status_code == 409 and "cannot be served" in api.json()["detail"]
    # named from the run's folder on: the server's disks are no user's business
    assert f"run-{good.pk}/rollouts.jsonl.zst" in api.json()["detail"]
    assert str(archive.archive_dir(good).parent) not in api.json()["detail"] + page.content.decode()
    restore = signed_in.post(f"/api/v1/runs/{good.pk}/restore", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert restore.status_code == 409 and str(archive.archive_dir(good).parent) not in restore.json()["detail"]


def test_the_sft_and_atif_exports_of_an_archived_run_are_refused_with_the_way_out(collected, signed_in, tmp_path):
    good, _ = collected
    archive.archive_run(good)
    good.refresh_from_db()
    page = signed_in.get(reverse("run_export_sft", args=[good.pk]))
    assert page.status_code == 409 and "Restore it first" in page.content.decode()
    panel = signed_in.get(reverse("run_export_sft_check", args=[good.pk]))
    assert panel.status_code == 200 and "is archived" in panel.content.decode()
    with pytest.raises(CommandError, match="is archived"):
        call_command("export_sft", "--run", str(good.pk), "--output", str(tmp_path / "sft.jsonl"))
    with pytest.raises(CommandError, match="is archived"):
        call_command("export_atif", str(good.pk), "--output-dir", str(tmp_path / "atif"))


def test_a_run_being_collected_is_refused_not_cancelled(db):
    run = make_run(3, status=Run.Status.RUNNING)
    for fn in (archive.delete_run, archive.archive_run):
        with pytest.raises(archive.RunBusy, match="Cancel it first"):
            fn(run)
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and Rollout.objects.filter(run=run).count() == 3
    # a cancelled run whose rollouts are still in flight is refused too
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CANCELLED)
    Rollout.objects.filter(run=run).update(status=Rollout.Status.RUNNING)
    run.refresh_from_db()
    with pytest.raises(archive.RunBusy, match="3 rollout"):
        archive.delete_run(run)


def test_a_run_cancelled_while_its_worker_was_dead_can_be_deleted_once_the_sweep_ends_its_rollouts(db):
    from rollouts.workers import claims

    run = make_run(3, status=Run.Status.CANCELLED)
    Rollout.objects.filter(run=run).update(status=Rollout.Status.CANCELLED)
    # A worker SIGKILLed mid-run held two rollouts: they stay "running" with their lease lapsing.
    held = list(Rollout.objects.filter(run=run).values_list("id", flat=True)[:2])
    Rollout.objects.filter(id__in=held).update(
        status=Rollout.Status.RUNNING, lease_until=timezone.now() - timedelta(seconds=1), worker="dead"
    )
    with pytest.raises(archive.RunBusy, match="2 rollout"):
        archive.delete_run(run)
    assert "ended 2 rollout(s) of cancelled runs whose worker stopped" in claims.supervise()
    ended = Rollout.objects.filter(id__in=held)
    assert set(ended.values_list("status", flat=True)) == {Rollout.Status.CANCELLED}
    assert Rollout.objects.filter(run=run).count() == 3, "no new attempt for a cancelled run"
    archive.delete_run(run)
    assert not Run.objects.filter(pk=run.pk).exists()


# -- delete -----------------------------------------------------------------------------------------
def test_delete_removes_the_run_and_everything_under_it_and_nothing_else(collected, _archive_dir):
    good, bad = collected
    _review(good)
    kept = {
        m: m.objects.filter(**{f: bad}).count()
        for m, f in ((Rollout, "run"), (Task, "run"), (TrajectoryItem, "rollout__run"), (AgentCall, "rollout__run"))
    }
    assert kept[Rollout] > 0
    out = archive.delete_run(good)
    assert out.rollouts == 10 and out.items > 0 and out.batches > 4
    assert not Run.objects.filter(pk=good.pk).exists()
    for model, f in (
        (Rollout, "run_id"),
        (Task, "run_id"),
        (TrajectoryItem, "rollout__run_id"),
        (AgentCall, "rollout__run_id"),
    ):
        assert model.objects.filter(**{f: good.pk}).count() == 0
    assert RolloutLabel.objects.count() == 0 and Note.objects.count() == 0 and RewardCorrection.objects.count() == 0
    assert Label.objects.filter(name="good").exists()  # the instance's labels stay
    assert good.dataset_id is None or good.dataset.__class__.objects.filter(pk=good.dataset_id).exists()
    for model, f in ((Rollout, "run"), (Task, "run"), (TrajectoryItem, "rollout__run"), (AgentCall, "rollout__run")):
        assert model.objects.filter(**{f: bad}).count() == kept[model]


def test_deleting_an_archived_run_removes_its_files(collected, _archive_dir):
    good, _ = collected
    archive.archive_run(good)
    assert (_archive_dir / f"run-{good.pk}").is_dir()
    good.refresh_from_db()
    archive.delete_run(good)
    assert not (_archive_dir / f"run-{good.pk}").exists()


def test_delete_run_command(collected, capsys):
    good, bad = collected
    with pytest.raises(CommandError, match="no run #999"):
        call_command("delete_run", str(good.pk), "999")
    assert Run.objects.filter(pk=good.pk).exists()
    with pytest.raises(CommandError, match=r"^no run #999, #998; nothing was archived$"):  # each id once
        call_command("archive_run", "999", "998", "999")
    with pytest.raises(CommandError, match=r"no run #9223372036854775808;"):  # past a bigint: no run, no crash
        call_command("archive_run", str(2**63))
    archive.archive_run(good)
    with pytest.raises(CommandError, match=f"run {bad.pk} is not archived; nothing was restored"):
        call_command("restore_run", str(good.pk), str(bad.pk))  # refused before the first is done
    assert Run.objects.get(pk=good.pk).is_archived
    call_command("restore_run", str(good.pk))
    call_command("delete_run", str(good.pk))
    assert "deleted run #%d: 10 rollouts" % good.pk in capsys.readouterr().out
    assert list(Run.objects.values_list("pk", flat=True)) == [bad.pk]


def test_collect_resume_refuses_an_archived_run(
    tmp_path, collected, counter_env_url, counter_agent_url, counter_tasks_path
):
    good, _ = collected
    archive.archive_run(good)
    out = tmp_path / "good" / "rollouts.jsonl"
    with pytest.raises(CommandError, match=f"run #{good.pk} is archived; restore it first"):
        call_command(
            "collect",
            "--agent-url",
            counter_agent_url,
            "--env-url",
            counter_env_url,
            "--input",
            str(counter_tasks_path),
            "--output",
            str(out),
            "--no-progress",
            "--resume",
        )
    assert Rollout.objects.filter(run=good).count() == 10


def test_archive_and_restore_commands(collected, capsys):
    good, _ = collected
    call_command("archive_run", str(good.pk))
    assert "archived run #%d" % good.pk in capsys.readouterr().out
    assert Run.objects.get(pk=good.pk).is_archived
    call_command("restore_run", str(good.pk))
    assert "restored run #%d: 10 rollouts" % good.pk in capsys.readouterr().out
    assert not Run.objects.get(pk=good.pk).is_archived
    with pytest.raises(CommandError, match="is not archived"):
        call_command("restore_run", str(good.pk))


# -- prune ------------------------------------------------------------------------------------------
def test_prune_deletes_or_archives_only_finished_runs_older_than_the_age(db, capsys):
    old = make_run(2, name="old")
    new = make_run(2, name="new")
    running = make_run(2, name="running", status=Run.Status.RUNNING)
    Run.objects.filter(pk=old.pk).update(finished=timezone.now() - timedelta(days=31))
    Run.objects.filter(pk=running.pk).update(created=timezone.now() - timedelta(days=60))
    Rollout.objects.filter(run__in=[old, new]).update(status=Rollout.Status.CANCELLED)

    call_command("prune", "--older-than", "30d", "--dry-run")
    assert "would delete run %d (old)" % old.pk in capsys.readouterr().out
    assert Run.objects.count() == 3

    call_command("prune", "--older-than", "30d", "--archive")
    assert Run.objects.get(pk=old.pk).is_archived and not Run.objects.get(pk=new.pk).is_archived
    assert "archived 1 run(s)" in capsys.readouterr().out
    call_command("prune", "--older-than", "30d", "--archive")  # the old run is older, but archived
    assert "no finished run not yet archived is older than 30d" in capsys.readouterr().out

    call_command("prune", "--older-than", "30d")
    assert sorted(Run.objects.values_list("name", flat=True)) == ["new", "running"]

    with pytest.raises(CommandError, match="expected a number and a unit"):
        call_command("prune", "--older-than", "thirty days")
    with pytest.raises(CommandError, match="at most 1000 years"):
        call_command("prune", "--older-than", "99999999999w")
    call_command("prune", "--older-than", "365000d", "--dry-run")
    assert "nothing to do" in capsys.readouterr().out, "an empty prune says so"


def test_parse_age():
    assert archive.parse_age("30d") == timedelta(days=30)
    assert archive.parse_age("12h") == timedelta(hours=12)
    assert archive.parse_age("2w") == timedelta(days=14)
    assert archive.parse_age("7") == timedelta(days=7)
    assert archive.parse_age(" 1.5 h ") == timedelta(minutes=90)
    for bad in ("-1d", "nand", "nan", "infd", "1e3d", "d", "", "30 days", "3x"):
        with pytest.raises(ValueError, match="expected a number and a unit"):
            archive.parse_age(bad)
    with pytest.raises(ValueError, match="at most 1000 years"):
        archive.parse_age("365001d")


# -- API --------------------------------------------------------------------------------------------
@pytest.fixture
def api(client, user):
    token = create_token(user, "t")[1]

    def call(method, path, **kw):
        return getattr(client, method)(f"/api/v1{path}", HTTP_AUTHORIZATION=f"Bearer {token}", **kw)

    return call


def test_api_archive_restore_and_delete(collected, api):
    good, bad = collected
    r = api("post", f"/runs/{good.pk}/archive")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["archived"] is not None and body["rollouts"] == 10
    assert body["archive_path"] == f"run-{good.pk}"  # the folder's name, not the server's disks
    assert api("get", f"/runs/{good.pk}").json()["archived"] is not None
    # a filtered rollouts.jsonl needs the responses: refused with the way out
    r = api("get", f"/runs/{good.pk}/rollouts.jsonl?status=succeeded")
    assert r.status_code == 409 and "Restore it first" in r.json()["detail"]
    r = api("get", f"/runs/{good.pk}/rollouts.jsonl")
    assert r.status_code == 200 and b"".join(r.streaming_content).count(b"\n") == 10
    # the results stream and one rollout whole need the items: refused with the way out too
    r = api("get", f"/runs/{good.pk}/results?wait=0")
    assert r.status_code == 409 and "Restore it first" in r.json()["detail"]
    one = Rollout.objects.filter(run=good).first()
    r = api("get", f"/rollouts/{one.pk}")
    assert r.status_code == 409 and "Restore it first" in r.json()["detail"]
    r = api("post", f"/runs/{good.pk}/retry")
    assert r.status_code == 409 and "Restore it first" in r.json()["detail"]
    r = api("post", f"/runs/{good.pk}/restore")
    assert r.status_code == 200 and r.json()["archived"] is None
    assert api("post", f"/runs/{good.pk}/restore").status_code == 409

    r = api("delete", f"/runs/{good.pk}")
    assert r.status_code == 200 and r.json()["rollouts"] == 10
    assert not Run.objects.filter(pk=good.pk).exists() and Run.objects.filter(pk=bad.pk).exists()
    assert api("delete", f"/runs/{good.pk}").status_code == 404


def test_api_refuses_to_delete_a_running_run(db, api):
    run = make_run(2, status=Run.Status.RUNNING)
    r = api("delete", f"/runs/{run.pk}")
    assert r.status_code == 409 and "Cancel it first" in r.json()["detail"]
    assert Run.objects.filter(pk=run.pk).exists()


def test_api_needs_a_token_to_delete(db, client):
    run = make_run(2)
    assert client.delete(f"/api/v1/runs/{run.pk}").status_code == 401
    assert Run.objects.filter(pk=run.pk).exists()


# -- pages ------------------------------------------------------------------------------------------
def test_delete_page_asks_then_deletes(collected, signed_in):
    good, bad = collected
    page = signed_in.get(reverse("run_delete", args=[good.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "Delete run" in text and "10 rollouts" in text and 'method="post"' in text
    assert Run.objects.filter(pk=good.pk).exists()  # asking deletes nothing
    response = signed_in.post(reverse("run_delete", args=[good.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("runs")
    assert not Run.objects.filter(pk=good.pk).exists() and Run.objects.filter(pk=bad.pk).exists()


def _stats(client, run) -> dict[str, str]:
    """The aggregates the run's pages show: the run page's figures, the profile, charts and
    evaluation pages whole (CSRF tokens and "checked N seconds ago"/"checked now" blanked) and the aggregate
    metrics file."""
    import re

    page = client.get(reverse("run", args=[run.pk])).content.decode()
    out = {m.group(1): m.group(2).strip() for m in re.finditer(r'id="(reward-mean[^"]*|run-shape)">([^<]*)<', page)}
    assert len(out) == 4, out  # shape, mean reward (successes, failures as 0, corrected)
    for name in ("run_profile", "run_charts", "run_evaluation", "run_aggregate_metrics"):
        response = client.get(reverse(name, args=[run.pk]))
        assert response.status_code == 200, name
        body = b"".join(response.streaming_content) if response.streaming else response.content
        text = re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"|"X-CSRFToken": "[^"]*"', "", body.decode())
        # naturaltime says "now" within a second and "N seconds ago" after it
        out[name] = re.sub(r"checked [^<]*(?:ago|now)", "", text)
    return out


def test_pages_of_an_archived_run_say_so_and_keep_every_aggregate(collected, signed_in):
    good, _ = collected
    _review(good)
    # aggregate metrics computed from the rows (not the env's stored reply), so they read the archive
    Run.objects.filter(pk=good.pk).update(aggregate_metrics=None)
    before = _stats(signed_in, good)
    assert before["reward-mean"] == "1.0000" and 'id="health"' in before["run_evaluation"]
    assert '"mean/reward": 1.0' in before["run_aggregate_metrics"]
    r = Rollout.objects.filter(run=good, status="succeeded").order_by("id").first()
    assert "is archived" not in signed_in.get(reverse("rollout", args=[good.pk, r.pk])).content.decode()
    signed_in.post(reverse("run_archive", args=[good.pk]))
    good.refresh_from_db()
    assert good.is_archived
    page = signed_in.get(reverse("run", args=[good.pk])).content.decode()
    assert 'id="run-archived"' in page and reverse("run_restore", args=[good.pk]) in page
    assert f"<code>run-{good.pk}</code>" in page and good.archive_path not in page
    delete_page = signed_in.get(reverse("run_delete", args=[good.pk])).content.decode()
    assert f"<code>run-{good.pk}</code>" in delete_page and good.archive_path not in delete_page
    assert signed_in.get(reverse("runs")).content.decode().count('class="badge archived"') == 1
    assert _stats(signed_in, good) == before
    # the trajectory page says the run is archived and offers restore; its parts answer 409
    traj = signed_in.get(reverse("rollout", args=[good.pk, r.pk]))
    assert traj.status_code == 200
    text = traj.content.decode()
    assert "is archived" in text and reverse("run_restore", args=[good.pk]) in text
    assert signed_in.get(reverse("rollout_raw", args=[good.pk, r.pk])).status_code == 409
    assert signed_in.get(reverse("run_atif", args=[good.pk])).status_code == 409
    filtered = signed_in.get(reverse("run_export", args=[good.pk, "rollouts"]) + "?status=succeeded")
    assert filtered.status_code == 409 and b"Restore it first" in filtered.content
    response = signed_in.post(
        reverse("run_restore", args=[good.pk]), {"next": reverse("rollout", args=[good.pk, r.pk])}
    )
    assert response.status_code == 302 and response["Location"] == reverse("rollout", args=[good.pk, r.pk])
    assert TrajectoryItem.objects.filter(rollout=r).count() > 0
    assert "is archived" not in signed_in.get(reverse("rollout", args=[good.pk, r.pk])).content.decode()


def test_delete_page_refuses_a_run_being_collected(db, signed_in):
    run = make_run(2, status=Run.Status.RUNNING)
    page = signed_in.get(reverse("run_delete", args=[run.pk])).content.decode()
    assert 'id="delete-busy"' in page and "Cancel it first" in page and 'id="confirm-delete"' not in page
    response = signed_in.post(reverse("run_delete", args=[run.pk]), follow=True)
    assert "Cancel it first" in response.content.decode()
    assert Run.objects.filter(pk=run.pk).exists() and Rollout.objects.filter(run=run).count() == 2


def test_staff_read_an_archived_runs_full_folder_other_users_only_its_name(collected, signed_in, user):
    good, _ = collected
    archive.archive_run(good)
    good.refresh_from_db()
    assert archive.shown_folder(good, user) == f"run-{good.pk}"
    user.is_staff = True
    user.save()
    page = signed_in.get(reverse("run", args=[good.pk])).content.decode()
    assert f"<code>{good.archive_path}</code>" in page
