"""The trajectory pages: one rollout's timeline (and its live tail while the attempt runs), one
item's body loaded in place, and the raw JSON of an attempt's output row or of one item.

Everything in a trajectory is untrusted text (agents and envs write it): templates only ever
autoescape it; nothing here marks data safe.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, QueryDict
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from rollouts.collection import export
from rollouts.lossless import displayable, dumps
from rollouts.models import AgentCall, RefusedReply, Rollout, Run, TrajectoryItem
from rollouts.web.access import rollout_for
from rollouts.web.archive_views import archived_rollout_response
from rollouts.web.evaluation_views import rollout_findings
from rollouts.web.find import find_in
from rollouts.web.items import display_max_chars, item_url_base, item_view, task_input, timeline, verify_view
from rollouts.web.markup import Budget
from rollouts.web.navigation import filter_querystring, neighbours
from rollouts.web.outline import outline
from rollouts.web.refused import refused_data, refused_view
from rollouts.web.review_views import review_context
from rollouts.web.verdict import verdict_view


def _verdict(rollout: Rollout, imported: bool, payloads: list[tuple[int, Any]]) -> dict[str, Any] | None:
    """The verdict panel (``verdict.verdict_view``) of a succeeded attempt; None without a verify
    reply the env added anything to."""
    try:
        verify_data = json.loads(rollout.verify_json) if rollout.verify_json else None
        task_row = json.loads(rollout.task.row_json)
    except ValueError:
        return None
    return verdict_view(verify_data, task_row, imported=imported, items=payloads, max_chars=display_max_chars())


ACTIVE_STATUSES = (Rollout.Status.PENDING, Rollout.Status.RUNNING)


def _attempt_views(rollout: Rollout) -> list[dict[str, Any]]:
    """Every row of ``rollout``'s key in order, numbered ``#1``, ``#2``… by position: a cancelled or
    interrupted row does not count as an attempt (the next one keeps its ``attempt`` number), so
    the stored number alone would show two ``#1``. ``label`` is the position,
    ``counted`` False for kill-shaped rows."""
    rows = list(
        Rollout.objects.filter(
            run_id=rollout.run_id, task_index=rollout.task_index, rollout_index=rollout.rollout_index
        )
        .order_by("attempt", "id")
        .values("id", "attempt", "status", "reward", "failure_kind", "terminal")
    )
    for n, row in enumerate(rows, 1):
        row["label"] = f"#{n}"
        row["counted"] = row["status"] not in Rollout.KILL_SHAPED
    return rows


_TOKEN_PATHS = {
    "input": ("input_tokens",),
    "output": ("output_tokens",),
    "total": ("total_tokens",),
    "cached": ("input_tokens_details", "cached_tokens"),
    "reasoning": ("output_tokens_details", "reasoning_tokens"),
}


def running_tokens(calls: list[Any]) -> dict[str, int | None] | None:
    """The token counts of a running attempt's stored agent calls, summed from each call's
    ``usage``: ``{"input", "output", "total", "cached", "reasoning"}`` (a count no call reported
    is ``None``), or ``None`` when no call reported usage."""
    sums: dict[str, int | None] = dict.fromkeys(_TOKEN_PATHS, 0)
    reported = False
    for call in calls:
        usage = call.usage if isinstance(getattr(call, "usage", None), dict) else None
        if usage is None:
            continue
        reported = True
        for name, path in _TOKEN_PATHS.items():
            value: Any = usage
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            current = sums[name]
            ok = isinstance(value, int) and not isinstance(value, bool)
            sums[name] = current + value if ok and current is not None else None
    return sums if reported else None


def _live_counts(rollout: Rollout, steps: list[dict[str, Any]], num_items: int) -> dict[str, Any]:
    """The header's counts: a running attempt's stored rows (its row's counters, tokens included,
    are written when it ends), a finished one's own counters."""
    if rollout.status in ACTIVE_STATUSES:
        views = [v for s in steps for v in s["items"] + s["tail"]]
        return {
            "tokens": running_tokens([s["call"] for s in steps if s["call"] is not None]),
            "calls": sum(1 for s in steps if s["call"] is not None),
            "items": num_items,
            "tools": sum(
                1
                for v in views
                if v.get("origin") == TrajectoryItem.Origin.GYM and v.get("template", "").endswith("output.html")
            ),
        }
    return {"calls": rollout.num_agent_calls, "items": num_items, "tools": rollout.num_tool_calls}


def _trajectory_context(request, rollout: Rollout) -> dict[str, Any]:
    """What the trajectory page and its live tail (``rollout_live``) render: the timeline, its
    outline, the header's counts, the failure and verify panels, health findings."""
    run = rollout.run
    imported = run.status == Run.Status.IMPORTED
    payloads: list[tuple[int, Any]] = []
    steps, num_items = timeline(rollout, payloads=payloads)
    context = {
        "run": run,
        "rollout": rollout,
        "imported": imported,
        "steps": steps,
        "num_items": num_items,
        "counts": _live_counts(rollout, steps, num_items),
        "outline": outline(steps, imported=imported, started=None),
        "live": rollout.status in ACTIVE_STATUSES and not imported,
        "verify": verify_view(rollout.verify_json, item_url_base(rollout))
        if rollout.status == Rollout.Status.SUCCEEDED
        else None,
        "verdict": _verdict(rollout, imported, payloads) if rollout.status == Rollout.Status.SUCCEEDED else None,
        "raw_url": reverse("rollout_raw", args=[run.pk, rollout.pk]),
        "live_url": reverse("rollout_live", args=[run.pk, rollout.pk]),
        "kill_shaped": rollout.status in Rollout.KILL_SHAPED,
    }
    context["live_seen"] = live_signature(rollout.status, num_items, sum(1 for s in steps if s["call"] is not None))
    context["error_text"], context["error_cut"] = Budget(display_max_chars()).clip(rollout.error or "")
    refused = RefusedReply.objects.filter(rollout=rollout).first() if rollout.status == Rollout.Status.FAILED else None
    context["refused"] = refused_view(refused, display_max_chars())
    context.update(rollout_findings(rollout, steps))  # health findings, each on its step
    return context


def live_signature(status: str, items: int, calls: int) -> str:
    """What a live tail last showed: changes with every stored item or agent call and with the status."""
    return f"{status}.{items}.{calls}"


def _render(request, template: str, context: dict[str, Any]) -> HttpResponse:
    """``render``, with a lone UTF-16 surrogate of a stored value (an env may send ``"\\ud800"``,
    kept as that escape) shown as U+FFFD wherever the page prints it: no page can encode it."""
    return HttpResponse(displayable(render_to_string(template, context, request)))


@login_required
def rollout_detail(request, run_id, rollout_id):
    """One rollout's trajectory: outline, foldable steps and items, search (``?q=``, client side),
    and while the attempt runs, a tail that polls ``rollout_live`` for new steps."""
    rollout = rollout_for(request, run_id, rollout_id)
    run = rollout.run
    if run.is_archived:
        return archived_rollout_response(request, rollout)
    try:
        task_row = json.loads(rollout.task.row_json)
    except ValueError:
        task_row = {}
    context = _trajectory_context(request, rollout)
    steps = context["steps"]
    qs = filter_querystring(request.GET)
    nav = neighbours(rollout, request.GET)
    suffix = f"?{qs}" if qs else ""
    # j/k keep the in-page search, so the next rollout opens with its hits highlighted too
    search_q = request.GET.get("q", "")[:500]
    nav_qs = "&".join(p for p in (qs, urlencode({"q": search_q}) if search_q else "") if p)
    nav_suffix = f"?{nav_qs}" if nav_qs else ""
    context.update(
        {
            "task_input": task_input(task_row, item_url_base(rollout)),
            "tools": [
                t.get("name")
                for t in (task_row.get("responses_create_params") or {}).get("tools") or []
                if isinstance(t, dict)
            ],
            # every step but the last is fixed; the last one (the tail) is re-read while the attempt runs
            "head_steps": steps[:-1] if context["live"] else steps,
            "tail_steps": steps[-1:] if context["live"] else [],
            "tail_from": steps[-1]["index"] if steps else 0,
            "attempts": _attempt_views(rollout),
            "nav": nav,
            "filter_qs": qs,
            "search_q": search_q,
            "run_url": reverse("run", args=[run.pk]) + suffix,
            "prev_url": reverse("rollout", args=[run.pk, nav["prev_id"]]) + nav_suffix if nav["prev_id"] else "",
            "next_url": reverse("rollout", args=[run.pk, nav["next_id"]]) + nav_suffix if nav["next_id"] else "",
        }
    )
    context.update(review_context(request, rollout, nav=nav))  # labels, notes, review mode
    return _render(request, "rollouts/rollout_detail.html", context)


@login_required
@require_safe
@never_cache
def rollout_live(request, run_id, rollout_id):
    """The live tail of a running attempt's page (polled every 2 s by the page): the steps from
    ``?from=N`` on (the step the page last showed as its tail, re-read whole: its tool outputs may
    have arrived), a new tail element that polls from the newest step, and out-of-band the header
    counts, the outline and, once the attempt is final, its failure and verify panels. The tail of
    a final attempt carries no trigger, so polling stops."""
    rollout = rollout_for(request, run_id, rollout_id)
    if rollout.run.is_archived:
        return archived_rollout_response(request, rollout, page=False)
    try:
        start = max(0, int(request.GET.get("from", "0")))
    except ValueError:
        start = 0
    seen = request.GET.get("seen")
    if seen and seen == live_signature(
        rollout.status,
        TrajectoryItem.objects.filter(rollout=rollout).count(),
        AgentCall.objects.filter(rollout=rollout).count(),
    ):
        return HttpResponse(status=204)  # nothing new: htmx swaps nothing and the tail polls on
    context = _trajectory_context(request, rollout)
    steps = [s for s in context["steps"] if s["index"] >= start]
    context.update(
        {
            "head_steps": steps[:-1] if context["live"] else steps,
            "tail_steps": steps[-1:] if context["live"] else [],
            "tail_from": steps[-1]["index"] if steps else start,
            "oob": True,
        }
    )
    if not context["live"]:
        # The attempt ended: its review panel (reward, "correct the reward…") is re-rendered as the
        # page would show it now, with the page's own query (review mode, filters) from htmx.
        page = _same_site_page(request, rollout)
        params = QueryDict(page.partition("?")[2]) if page else QueryDict()
        back = page or reverse("rollout", args=[rollout.run_id, rollout.pk])
        context.update(review_context(request, rollout, params=params, back=back))
    return _render(request, "rollouts/partials/rollout_live.html", context)


def _same_site_page(request, rollout: Rollout) -> str:
    """The rollout page the live poll came from (htmx's ``HX-Current-URL``) as a local path with
    its query, or ``""`` when the header is missing or names another page."""
    url = urlsplit(request.headers.get("HX-Current-URL", ""))
    page = reverse("rollout", args=[rollout.run_id, rollout.pk])
    if url.path != page:
        return ""
    return page + (f"?{url.query}" if url.query else "")


_ITEM_KEY_RE = re.compile(r"^(?:\d{1,9}|input-\d{1,9}|instructions|verify)$")


@login_required
@require_safe
def rollout_item(request, run_id, rollout_id, key):
    """One item's body for the trajectory page, loaded in place by HTMX (``request.htmx``: the
    ``item_body.html`` partial alone; otherwise a page with the item, the links' fallback).

    ``key``: the item's seq (``#N``), ``input-K`` (the K-th task input item), ``instructions``,
    or ``verify`` (the verify panel). ``?full=1``: the whole text, without the display limit
    (texts over ``markup.RICH_MAX_CHARS`` as plain text); ``?view=plain``: texts and JSON as
    they came. 404 for a rollout not of this run, an item it does not have, an unknown key, and
    ``verify`` of an attempt that did not succeed."""
    rollout = rollout_for(request, run_id, rollout_id)
    if rollout.run.is_archived:
        return archived_rollout_response(request, rollout, page=False)
    if not _ITEM_KEY_RE.match(key):
        raise Http404("no such item")
    plain = request.GET.get("view") == "plain"
    full = request.GET.get("full") == "1"
    max_chars = sys.maxsize if full else display_max_chars()
    item_url = item_url_base(rollout)
    raw_url = reverse("rollout_raw", args=[rollout.run_id, rollout.pk])
    context: dict[str, Any] = {
        "run": rollout.run,
        "rollout": rollout,
        "raw_url": raw_url,
        "rollout_url": reverse("rollout", args=[rollout.run_id, rollout.pk]),
    }
    if key == "verify":
        if rollout.status != Rollout.Status.SUCCEEDED:
            raise Http404("only a succeeded attempt has a verify result")
        context["verify"] = verify_view(rollout.verify_json, item_url, max_chars, full)
        if context["verify"] is None:
            raise Http404("no verify result")
        if request.htmx:
            return _render(request, "rollouts/partials/rollout_verify.html", context)
        return _render(request, "rollouts/rollout_item.html", context)
    if key == "instructions" or key.startswith("input-"):
        try:
            task_row = json.loads(rollout.task.row_json)
        except ValueError:
            task_row = {}
        views = task_input(task_row if isinstance(task_row, dict) else {}, item_url, max_chars, plain, full)
        view = next((v for v in views if v.get("key") == key), None)
    else:
        row = (
            TrajectoryItem.objects.filter(rollout=rollout, seq=int(key))
            .values("seq", "origin", "asked", "paired", "refused", "latency_ms", "tool_status", "payload")
            .first()
        )
        view = (
            None
            if row is None
            else item_view(
                row["payload"],
                seq=row["seq"],
                origin=row["origin"],
                asked=row["asked"],
                paired=row["paired"],
                refused=row["refused"],
                latency_ms=row["latency_ms"],
                tool_status=row["tool_status"],
                max_chars=max_chars,
                item_url=item_url,
                plain=plain,
                full=full,
            )
        )
    if view is None:
        raise Http404("this attempt has no such item")
    context["item"] = view
    if request.htmx:
        return _render(request, "rollouts/partials/item_body.html", context)
    return _render(request, "rollouts/rollout_item.html", context)


FIND_MAX_CHARS = 500


def _verify_fields(rollout: Rollout) -> list[tuple[str, Any]]:
    """``[("verify", fields)]``: the verify reply's own fields (not the echoed task and response,
    searched as items already) of a succeeded attempt; ``[]`` otherwise."""
    if rollout.status != Rollout.Status.SUCCEEDED or not rollout.verify_json:
        return []
    try:
        data = json.loads(rollout.verify_json)
    except ValueError:
        return [("verify", rollout.verify_json)]
    if not isinstance(data, dict):
        return []
    return [("verify", {k: v for k, v in data.items() if k not in ("response", "responses_create_params")})]


@login_required
@require_safe
@never_cache
def rollout_find(request, run_id, rollout_id):
    """Find ``?q=`` (case-insensitive) in the rollout's whole stored text, past the display cut:
    JSON ``{"q", "hits": total, "items": [{"key": item key ("12", "input-0", "instructions",
    "verify" for the verify reply's own fields),
    "hits": n, "offsets": [...]}]}`` in page order; the trajectory page loads the full body of an
    item whose hit its cut hides. ``q`` over 500 characters is cut; an empty ``q`` finds nothing."""
    rollout = rollout_for(request, run_id, rollout_id)
    if rollout.run.is_archived:
        return archived_rollout_response(request, rollout, page=False)
    needle = request.GET.get("q", "")[:FIND_MAX_CHARS]
    found: list[dict[str, Any]] = []
    if needle.strip():
        try:
            task_row = json.loads(rollout.task.row_json)
        except ValueError:
            task_row = {}
        params = (task_row.get("responses_create_params") if isinstance(task_row, dict) else None) or {}
        inputs: list[tuple[str, Any]] = []
        if isinstance(params.get("instructions"), str):
            inputs.append(("instructions", params["instructions"]))
        first = params.get("input")
        if isinstance(first, str):
            first = [first]
        inputs += [(f"input-{k}", item) for k, item in enumerate(first if isinstance(first, list) else [])]
        rows = TrajectoryItem.objects.filter(rollout=rollout).order_by("seq").values_list("seq", "payload")
        for key, payload in [
            *inputs,
            *((str(seq), payload) for seq, payload in rows.iterator()),
            *_verify_fields(rollout),
        ]:
            hits, offsets = find_in(payload, needle)
            if hits:
                found.append({"key": key, "hits": hits, "offsets": offsets})
    body = {"q": needle, "hits": sum(f["hits"] for f in found), "items": found}
    return HttpResponse(json.dumps(body), content_type="application/json")


def raw_row(rollout: Rollout) -> dict[str, Any] | None:
    """The output-file row of an attempt, built exactly as the exports build it: a success's
    ``rollouts.jsonl`` row, a failure's sidecar row (an imported line kept as it came, as it came);
    None for attempts written to no file."""
    if rollout.source_text and rollout.status in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED):
        return json.loads(rollout.source_text)
    task_row = json.loads(rollout.task.row_json)
    stamp = export.stamps_rows(rollout.run)
    if rollout.status == Rollout.Status.SUCCEEDED:
        agent_ref = task_row.get("agent_ref") or {"name": rollout.run.agent_name}
        return export.success_row(
            rollout.verify_json,
            rollout.task_index,
            rollout.rollout_index,
            agent_ref,
            stamp,
            export.agent_ordered(rollout.run),
        )
    if rollout.status == Rollout.Status.FAILED:
        error = export.sidecar_error(rollout.error, rollout.nemo_error)
        return export.failure_row(task_row, rollout.rollout_index, error, rollout.terminal, stamp)
    return None


@login_required
def rollout_raw(request, run_id, rollout_id):
    """The attempt's output-file row (``raw_row``) as JSON. ``?item=N`` gives trajectory item N
    whole instead, ``?item=input`` the task's materialised row (what the trajectory page links
    to when it cuts a long text), for attempts of any status, and ``?item=refused`` the agent reply
    gymweb refused (``refused.refused_data``; 404 when there is none)."""
    rollout = rollout_for(request, run_id, rollout_id)
    if rollout.run.is_archived:
        return archived_rollout_response(request, rollout, page=False)
    which = request.GET.get("item")
    if which is not None:
        return _raw_item(rollout, which)
    row = raw_row(rollout)
    if row is None:
        body = {"error": f"this attempt is {rollout.status}: it is written to no output file, so it has no row"}
        return _json_response(body, status=404)
    return _json_response(row)


def _json_response(body: Any, status: int = 200) -> HttpResponse:
    """``body`` as indented JSON (non-ASCII kept, U+0000 escaped as JSON escapes it); compact when
    it nests deeper than the indenting encoder can go."""
    try:
        text = json.dumps(body, indent=2, ensure_ascii=False)
    except RecursionError:
        text = dumps(body)
    return HttpResponse(text, status=status, content_type="application/json; charset=utf-8")


def _raw_item(rollout: Rollout, which: str) -> HttpResponse:
    if which == "refused":
        data = refused_data(RefusedReply.objects.filter(rollout=rollout).first())
        if data is None:
            return _json_response({"error": "gymweb refused no agent reply in this attempt"}, status=404)
        return _json_response(data)
    if which == "input":
        try:
            return _json_response(json.loads(rollout.task.row_json))
        except ValueError:
            return HttpResponse(rollout.task.row_json, content_type="text/plain; charset=utf-8")
    try:
        seq = int(which)
    except ValueError:
        return _json_response({"error": "item must be an item number (#N on the page) or 'input'"}, status=404)
    row = TrajectoryItem.objects.filter(rollout=rollout, seq=seq).values("seq", "step", "origin", "payload").first()
    if row is None:
        return _json_response({"error": f"this attempt has no item #{seq}"}, status=404)
    return _json_response(row["payload"])
