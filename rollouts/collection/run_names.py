"""Run names: an imported run's default name from its files, and the check of a name typed by a
user (the import page, the run page's rename form). Names are plain text, at most ``MAX_NAME``
characters, shown escaped everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from rollouts.models import Run

__all__ = ["MAX_NAME", "clean_name", "file_label", "import_name"]

MAX_NAME = 200


def clean_name(text: str) -> str:
    """``text`` stripped; raises ``ValueError`` (the message says why) when it is empty or longer
    than ``MAX_NAME`` characters."""
    name = (text or "").strip()
    if not name:
        raise ValueError("A run name cannot be empty.")
    if len(name) > MAX_NAME:
        raise ValueError(f"A run name has at most {MAX_NAME} characters (this one has {len(name)}).")
    return name


def file_label(file_name: str) -> str:
    """A file as a name part: ``folder/file`` when ``file_name`` is a relative path
    (``data/swebench/example_rollouts.jsonl`` -> ``swebench/example_rollouts.jsonl``), else the name."""
    parts = [p for p in PurePosixPath(file_name.replace("\\", "/")).parts if p not in ("", ".", "/")]
    return "/".join(parts[-2:]) if parts else ""


def import_name(typed: str, file_names: Sequence[str]) -> str:
    """The name of a new imported run: ``typed`` (stripped, cut to ``MAX_NAME``) when given; else
    its files' labels (``file_label``; ``a + b``, or ``a + N more file(s)``), with `` (N)`` added
    when a run already has that name (N: how many runs' names start with it, plus one)."""
    name = (typed or "").strip()[:MAX_NAME]
    if name:
        return name
    shown = [file_label(n) for n in file_names if file_label(n)]
    base = (
        " + ".join(shown) if len(shown) <= 2 else f"{shown[0]} + {len(shown) - 1} more file(s)"
    ) or "imported rollouts"
    base = base[: MAX_NAME - 8]
    if not Run.objects.filter(name=base).exists():
        return base
    n = Run.objects.filter(name__startswith=base).count() + 1
    while Run.objects.filter(name=f"{base} ({n})").exists():
        n += 1
    return f"{base} ({n})"
