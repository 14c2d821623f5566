"""``reverify`` and ``aggregate`` refuse an env URL whose host is a legacy spelling of an address
(``0177.0.0.1``: octal for 127.0.0.1) with a clear error naming it, never a traceback; nothing is
stored or written."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from rollouts.models import Run

from .run_factories import finish, key, make_run

SPELLINGS = ["http://0177.0.0.1:9", "http://0x7f000001:9", "http://2130706433:9"]


@pytest.mark.parametrize("url", SPELLINGS)
def test_reverify_refuses_a_legacy_address_spelling_with_a_clear_error(db, url):
    source = make_run(1)
    finish(key(source, 0), "succeeded", 1.0)
    with pytest.raises(CommandError, match="0177|0x7f|2130706433|spelling|127.0.0.1"):
        call_command("reverify", str(source.pk), "--env-url", url, "--force")
    assert Run.objects.count() == 1


@pytest.mark.parametrize("url", SPELLINGS)
def test_aggregate_refuses_a_legacy_address_spelling_with_a_clear_error(tmp_path, url):
    shard = tmp_path / "rollouts.jsonl"
    shard.write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "response": {}}\n')
    out = tmp_path / "merged.jsonl"
    with pytest.raises(CommandError, match="0177|0x7f|2130706433|spelling|127.0.0.1"):
        call_command("aggregate", "--input-glob", str(tmp_path / "r*.jsonl"), "--output", str(out), "--env-url", url)
    assert not out.exists()
