"""Drive gymweb from a script through its HTTP API: upload a dataset, launch a run, wait for it,
download its ``rollouts.jsonl`` (NeMo Gym's format).

    export GYMWEB_TOKEN=gw_...            # made on your account page (click your name)
    python -m gymweb.examples.api_client --url http://127.0.0.1:8000 \\
        --dataset gymweb/examples/data/counter_tasks.jsonl \\
        --agent-url http://127.0.0.1:9102 --env-url http://127.0.0.1:9101 \\
        --output results/rollouts.jsonl

It prints the run's progress while it waits and exits 0 once the file is written (1 when the run
was cancelled, or on any API error, which it prints). Only httpx is needed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url", default=os.environ.get("GYMWEB_URL", "http://127.0.0.1:8000"), help="gymweb's base URL"
    )
    parser.add_argument("--token", default=os.environ.get("GYMWEB_TOKEN"), help="API token (default: $GYMWEB_TOKEN)")
    parser.add_argument("--dataset", required=True, type=Path, help="a NeMo Gym JSONL dataset to upload")
    parser.add_argument("--agent-url", required=True)
    parser.add_argument("--env-url", required=True)
    parser.add_argument("--num-repeats", type=int, default=1)
    parser.add_argument("--name", default="")
    parser.add_argument("--output", type=Path, default=Path("rollouts.jsonl"))
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between status checks")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="give up waiting after this long")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("no token: pass --token or set GYMWEB_TOKEN (make one on your account page)")

    # trust_env=False: talk to gymweb directly, whatever proxy variables the shell has.
    with httpx.Client(
        base_url=args.url.rstrip("/") + "/api/v1",
        headers={"Authorization": f"Bearer {args.token}"},
        timeout=60.0,
        trust_env=False,
    ) as api:
        try:
            with args.dataset.open("rb") as fh:
                dataset = check(api.post("/datasets", files={"file": (args.dataset.name, fh, "application/jsonl")}))
            print(f"dataset #{dataset['id']}: {dataset['num_rows']} rows")
            run = check(
                api.post(
                    "/runs",
                    json={
                        "dataset": dataset["id"],
                        "agent_url": args.agent_url,
                        "env_url": args.env_url,
                        "num_repeats": args.num_repeats,
                        "name": args.name,
                    },
                )
            )
            print(f"run #{run['id']} started: {run['url']}")
            deadline = time.monotonic() + args.timeout_s
            while not run["final"]:
                if time.monotonic() > deadline:
                    print(f"gave up waiting after {args.timeout_s:g} s; the run goes on", file=sys.stderr)
                    return 1
                time.sleep(args.poll_s)
                run = check(api.get(f"/runs/{run['id']}"))
                p = run["progress"]
                print(
                    f"  {run['status']}: {p['done']}/{p['total']} done, {p['succeeded']} succeeded, {p['failed']} failed"
                )
            args.output.parent.mkdir(parents=True, exist_ok=True)
            rows = 0
            with api.stream("GET", f"/runs/{run['id']}/rollouts.jsonl") as response:
                check(response, stream=True)
                with args.output.open("wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
                        rows += chunk.count(b"\n")
            print(f"wrote {rows} rows to {args.output}")
            return 0 if run["status"] == "completed" else 1
        except ApiError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1


class ApiError(RuntimeError):
    pass


def check(response: httpx.Response, stream: bool = False):
    """The JSON body of a 2xx reply; ``ApiError`` with the API's ``detail`` otherwise."""
    if response.status_code >= 300:
        if stream:
            response.read()
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text[:300]
        raise ApiError(f"{response.request.method} {response.request.url.path}: HTTP {response.status_code}: {detail}")
    return None if stream else response.json()


if __name__ == "__main__":
    sys.exit(main())
