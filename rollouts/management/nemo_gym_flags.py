"""NeMo Gym's ``+key=value`` / ``++key=value`` spellings as aliases of a command's own flags.

NeMo Gym's CLI passes its options to Hydra, so its docs and scripts write them as overrides
(``+resume_from_cache=true``, ``++allow_partial_rollouts=True``, ``+num_repeats=4``). A command
that mixes in ``NemoGymFlags`` and names the keys it knows in ``nemo_gym_flags`` (NeMo Gym's key →
the command's ``--flag``) accepts those words too: a boolean flag is given for ``true``/``True``/
``1``/``yes`` and left out for ``false``/``False``/``0``/``no``; any other flag gets the value.
An unknown key or a boolean that is neither is a clear error, never silently dropped.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError

__all__ = ["NemoGymFlags", "rewrite"]

_OVERRIDE = re.compile(r"\+{1,2}([A-Za-z_][A-Za-z0-9_.]*)=(.*)", re.DOTALL)
_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def rewrite(args: Sequence[str], flags: dict[str, str], booleans: set[str], command: str) -> list[str]:
    """``args`` with each ``+key=value``/``++key=value`` replaced by the command's flag (``flags``:
    NeMo Gym key → ``--flag``; ``booleans``: the flags that take no value). Raises ``CommandError``
    for a key the command does not know or a boolean value that is not one."""
    out: list[str] = []
    for arg in args:
        match = _OVERRIDE.fullmatch(arg) if isinstance(arg, str) else None
        if match is None:
            out.append(arg)
            continue
        key, value = match.groups()
        flag = flags.get(key)
        if flag is None:
            known = ", ".join(f"+{k}" for k in sorted(flags)) or "none"
            raise CommandError(f"{arg}: {command} does not know NeMo Gym's {key!r} (NeMo Gym keys it takes: {known})")
        if flag in booleans:
            word = value.strip().lower()
            if word not in _TRUE | _FALSE:
                raise CommandError(f"{arg}: {key} takes true or false (got {value!r})")
            if word in _TRUE:
                out.append(flag)
        else:
            out += [flag, value]
    return out


class NemoGymFlags:
    """Mix into a ``BaseCommand`` (before it) and set ``nemo_gym_flags`` to accept NeMo Gym's
    ``+key=value`` spellings of its flags, on the command line and through ``call_command``."""

    nemo_gym_flags: dict[str, str] = {}

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)  # type: ignore[misc]
        booleans = {opt for action in parser._actions if action.nargs == 0 for opt in action.option_strings}
        flags, parse = self.nemo_gym_flags, parser.parse_args

        def parse_args(args: Sequence[str] | None = None, namespace: Any = None) -> Any:
            import sys

            given = list(sys.argv[2:] if args is None else args)
            return parse(rewrite(given, flags, booleans, subcommand), namespace)

        parser.parse_args = parse_args  # type: ignore[method-assign]
        return parser
