"""Files written by ``manage.py collect``: an existing output is never overwritten unless
``--overwrite`` (NeMo Gym's flag) or ``--resume`` says so; a refused command leaves no empty output
folder behind; the summary says what is left and whether ``--resume`` would retry it."""

from __future__ import annotations

import json
import os

import pytest
from aiohttp import web
from django.core.management import CommandError, call_command

from gymweb.examples._serve import BackgroundServer
from rollouts.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def _args(agent, env, tasks, out, *more):
    return ["--agent-url", agent, "--env-url", env, "--input", str(tasks), "--output", str(out), "--no-progress", *more]


def _read(path):
    return [json.loads(line) for line in path.read_text().split("\n") if line]


@pytest.fixture(scope="module")
def invalid_agent_url():
    """An agent whose replies are JSON objects but not Responses objects: terminal failures (rule 3)."""

    async def responses(request):
        return web.json_response({"not": "a Responses object"})

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    server = BackgroundServer(app).start()
    yield server.url
    server.stop()


# -- never overwrite silently -----------------------------------------------------------------------
def test_an_existing_output_is_refused_without_overwrite_or_resume(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    out.write_text("earlier results\n")
    with pytest.raises(CommandError) as caught:
        call_command("collect", *_args(counter_agent_url, counter_env_url, counter_tasks_path, out))
    assert str(caught.value) == (
        f"Output file already exists: '{out}'. Pass --overwrite to replace it with a new run, "
        "or --resume to continue the run that wrote it."
    )
    assert out.read_text() == "earlier results\n" and Run.objects.count() == 0


def test_an_existing_failures_sidecar_alone_is_refused_too(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    (tmp_path / "rollouts_failures.jsonl").write_text("earlier failures\n")
    with pytest.raises(
        CommandError, match="rollouts_failures.jsonl' already exists|already exists: '.*rollouts_failures.jsonl'"
    ):
        call_command("collect", *_args(counter_agent_url, counter_env_url, counter_tasks_path, out))
    assert not out.exists()


def test_a_health_file_of_another_output_in_the_same_folder_is_refused_too(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    call_command(
        "collect", *_args(counter_agent_url, counter_env_url, counter_tasks_path, tmp_path / "a.jsonl", "--limit", "1")
    )
    assert (tmp_path / "quality_summary.json").exists()
    with pytest.raises(CommandError, match=r"already exists: '.*quality_summary\.json'"):
        call_command(
            "collect",
            *_args(counter_agent_url, counter_env_url, counter_tasks_path, tmp_path / "b.jsonl", "--limit", "1"),
        )
    call_command(
        "collect",
        *_args(
            counter_agent_url,
            counter_env_url,
            counter_tasks_path,
            tmp_path / "b.jsonl",
            "--limit",
            "1",
            "--no-health-check",
        ),
    )
    assert len(_read(tmp_path / "b.jsonl")) == 1


def test_overwrite_replaces_the_files_with_a_new_run(
    tmp_path, capsys, counter_env_url, counter_agent_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    out.write_text("earlier results\n")
    (tmp_path / "rollouts_failures.jsonl").write_text("earlier failures\n")
    call_command("collect", *_args(counter_agent_url, counter_env_url, counter_tasks_path, out, "--overwrite"))
    assert len(_read(out)) == 5 and _read(tmp_path / "rollouts_failures.jsonl") == []
    assert f"deleted the existing output file {out} (--overwrite)" in capsys.readouterr().err


def test_resume_on_a_file_no_run_here_wrote_is_refused(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    out.write_text("someone else's results\n")
    with pytest.raises(CommandError, match="--resume: no run in this database wrote .*Pass --overwrite instead"):
        call_command("collect", *_args(counter_agent_url, counter_env_url, counter_tasks_path, out, "--resume"))
    assert out.read_text() == "someone else's results\n" and Run.objects.count() == 0


def test_resume_and_overwrite_together_are_refused(tmp_path, counter_tasks_path):
    with pytest.raises(CommandError, match="not allowed with argument"):
        call_command(
            "collect",
            *_args(
                "http://127.0.0.1:1",
                "http://127.0.0.1:2",
                counter_tasks_path,
                tmp_path / "o.jsonl",
                "--resume",
                "--overwrite",
            ),
        )


# -- no empty folder after a refused command -------------------------------------------------------------
@pytest.mark.parametrize(
    "case, message",
    [
        ("malformed", "line 2: not valid JSON"),
        ("missing", "no such file"),
        ("too many repeats", "would have 15 rollouts"),
    ],
)
def test_a_refused_command_leaves_no_output_folder(tmp_path, settings, counter_tasks_path, case, message):
    settings.GYMWEB_MAX_KEYS_PER_RUN = 12
    tasks = counter_tasks_path
    more = []
    if case == "malformed":
        tasks = tmp_path / "in.jsonl"
        tasks.write_text('{"responses_create_params": {"input": "hi"}}\n{not json\n')
    elif case == "missing":
        tasks = tmp_path / "nowhere.jsonl"
    else:
        more = ["--num-repeats", "3"]
    out = tmp_path / "new" / "results" / "rollouts.jsonl"
    with pytest.raises(CommandError, match=message):
        call_command("collect", *_args("http://127.0.0.1:1", "http://127.0.0.1:2", tasks, out, *more))
    assert not (tmp_path / "new").exists()
    assert Run.objects.count() == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no folder can be made")
def test_an_output_folder_that_cannot_be_made_is_refused_before_any_rollout_runs(tmp_path, counter_tasks_path):
    # os.access says yes to root for /proc and read-only mounts, so asking it is not enough: the
    # folder must be made before the run, not found missing when the files are written after it.
    out = "/proc/gymweb-no-such-folder/results/rollouts.jsonl"
    with pytest.raises(CommandError, match="cannot create folders in /proc"):
        call_command("collect", *_args("http://127.0.0.1:1", "http://127.0.0.1:2", counter_tasks_path, out))
    assert Run.objects.count() == 0


def test_the_output_folder_is_made_when_the_files_are_written(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    out = tmp_path / "new" / "results" / "rollouts.jsonl"
    call_command("collect", *_args(counter_agent_url, counter_env_url, counter_tasks_path, out, "--limit", "1"))
    assert len(_read(out)) == 1


# -- what is left, said after every run --------------------------------------------------------------------
def test_after_every_key_succeeded_resume_says_nothing_is_left(
    tmp_path, capsys, counter_env_url, counter_agent_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    call_command("collect", *_args(counter_agent_url, counter_env_url, counter_tasks_path, out))
    capsys.readouterr()
    call_command("collect", *_args(counter_agent_url, counter_env_url, counter_tasks_path, out, "--resume"))
    printed = capsys.readouterr().out
    assert "0 rollout(s) get a new attempt" in printed
    assert "every rollout succeeded: nothing is left to retry" in printed
    assert "--resume" not in printed.split("every rollout succeeded")[1]


def test_terminal_failures_are_named_as_never_retried(
    tmp_path, capsys, invalid_agent_url, counter_env_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    call_command("collect", *_args(invalid_agent_url, counter_env_url, counter_tasks_path, out, "--limit", "2"))
    first = capsys.readouterr().out
    call_command(
        "collect", *_args(invalid_agent_url, counter_env_url, counter_tasks_path, out, "--limit", "2", "--resume")
    )
    printed = capsys.readouterr().out
    for text in (first, printed):
        assert (
            "left: 2 rollout(s) failed terminally (an invalid Responses object): never retried, fix the agent" in text
        )
        assert "retry failed rollouts" not in text and "plus --resume" not in text
    assert "0 rollout(s) get a new attempt" in printed


def test_keys_out_of_attempts_say_how_to_retry_them(tmp_path, capsys, counter_env_url, counter_tasks_path):
    out = tmp_path / "rollouts.jsonl"
    args = _args("http://127.0.0.1:9", counter_env_url, counter_tasks_path, out, "--limit", "2", "--max-attempts", "2")
    call_command("collect", *args)
    assert (
        "left: 2 rollout(s) without a success can be retried: run the same command plus --resume"
        in capsys.readouterr().out
    )
    call_command("collect", *args, "--resume")
    assert "2 rollout(s) get a new attempt" in capsys.readouterr().out.split("\n")[0]
    call_command("collect", *args, "--resume")
    printed = capsys.readouterr().out
    assert "0 rollout(s) get a new attempt" in printed
    assert (
        "left: 2 rollout(s) used all 2 attempt(s): --resume retries them only with a higher --max-attempts" in printed
    )
