#!/usr/bin/env python3
"""Regenerate docs/screenshots/ from the browser tests' own pages (chromium, headless).

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots]

Runs the browser tests that take pictures with ``GYMWEB_SCREENSHOTS`` set to the output folder:
``runs_list.png`` (the runs list), ``run_detail.png`` (a run page after it completed live),
``trajectory.png`` and ``trajectory_folded.png`` (NeMo Gym's mini_swe_agent_2 task 0 with its
outline; as opened, then with every item folded). Needs /usr/bin/chromium and NeMo Gym's example
data beside the checkout (or ``GYMWEB_NEMO_GYM_DATA``). Exits with pytest's status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/test_browser_dashboard.py::test_a_run_started_in_the_browser_completes_live_and_downloads",
    "tests/test_browser_trajectory.py::test_outline_folding_keys_and_search_on_a_real_trace",
    "tests/test_browser_trajectory.py::test_a_running_rollout_grows_live_and_the_run_page_refreshes_at_the_end",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "screenshots"), help="folder for the PNG files")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GYMWEB_SCREENSHOTS": str(out)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS]
    status = subprocess.call(cmd, cwd=REPO, env=env)
    for png in sorted(out.glob("*.png")):
        print(f"{png.relative_to(REPO) if png.is_relative_to(REPO) else png}  {png.stat().st_size:,} bytes")
    return status


if __name__ == "__main__":
    sys.exit(main())
