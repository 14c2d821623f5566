"""Everything in a trajectory is untrusted text: pages that show it must stay inert."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from rollouts.models import Rollout, Run
from rollouts.templatetags.gymweb_tags import pretty_json
from tests.test_view_rollout_detail import call, make_rollout, make_run, make_task, msg, out

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
HX = '" hx-get="/x" hx-trigger="load'
RAW_HX = '<div hx-get="/x" hx-trigger="load">'
EVIL = f"{SCRIPT} {IMG} {HX} {RAW_HX}"
REPO = Path(__file__).resolve().parents[1]


def assert_inert(html: str) -> None:
    assert "<script>alert" not in html
    assert "<img src=x onerror" not in html
    assert 'hx-get="/x"' not in html and "hx-get='/x'" not in html
    assert 'hx-trigger="load' not in html
    # the only scripts are the page's own
    assert re.findall(r"<script[^>]*>", html) == [s for s in re.findall(r"<script[^>]*>", html) if 'src="/static/' in s]


def evil_rollout(status=Rollout.Status.FAILED) -> Rollout:
    run = make_run(f"run {EVIL}")
    task = make_task(
        run,
        row={
            "responses_create_params": {
                "input": [
                    {"role": "user", "content": EVIL},
                    {"role": EVIL, "content": [{"type": "input_text", "text": EVIL}]},
                ],
                "instructions": EVIL,
                "tools": [{"type": "function", "name": EVIL}],
            },
            "agent_ref": {"name": EVIL},
        },
    )
    items = [
        (0, {"type": "reasoning", "summary": [{"type": "summary_text", "text": EVIL}]}, {}),
        (0, call(EVIL, EVIL, json.dumps({"cmd": EVIL})), {"asked": True}),
        (0, call("c2", EVIL, EVIL), {"asked": True}),
        (0, call("c3", "agent_tool", "{}"), {"paired": True}),
        (0, out("c3", [{"type": "input_text", "text": EVIL}, {"type": EVIL, "x": EVIL}]), {"paired": True}),
        (0, out(EVIL, json.dumps({"stdout": EVIL})), {"origin": "gym", "latency_ms": 1.0, "tool_status": 200}),
        (0, out("c2", f"Error: gymweb did not call tool {EVIL!r}"), {"origin": "gym", "refused": True}),
        (1, {"type": EVIL, "name": EVIL, "data": EVIL}, {}),
        (
            1,
            {"type": "message", "role": "assistant", "id": EVIL, "content": [{"type": "refusal", "refusal": EVIL}]},
            {},
        ),
        (1, msg(EVIL), {}),
        (1, msg(EVIL, role=EVIL), {}),
    ]
    calls = [
        {"model": EVIL, "usage": {"input_tokens": EVIL, "output_tokens": 1}, "incomplete_details": {"reason": EVIL}},
        {"error": EVIL, "http_status": 500},
    ]
    verify = {"reward": 1.0, EVIL: 2.0, "note": EVIL, "reward_components": {EVIL: 1.0, "why": EVIL}}
    rollout = make_rollout(
        run,
        task,
        status=status,
        failure_kind=EVIL[:40] if status == "failed" else "",
        error=EVIL,
        verify=verify if status == "succeeded" else None,
        calls=calls,
        items=items,
        warnings=[EVIL],
    )
    return rollout


@pytest.mark.django_db
@pytest.mark.parametrize("status", [Rollout.Status.FAILED, Rollout.Status.SUCCEEDED])
def test_the_rollout_page_is_inert_whatever_the_trajectory_holds(signed_in, status):
    rollout = evil_rollout(status)
    make_rollout(
        rollout.run,
        rollout.task,
        attempt=2 if status == "failed" else 0,
        status=Rollout.Status.FAILED,
        failure_kind=EVIL[:40],
        error=EVIL,
    )  # another attempt, linked from the page
    response = signed_in.get(
        reverse("rollout", args=[rollout.run_id, rollout.pk]) + "?status=" + "%3Cscript%3E&sort=%22%3E%3Cimg"
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown, as text
    assert_inert(html)


@pytest.mark.django_db
def test_the_raw_view_is_json_that_browsers_will_not_sniff_as_html(signed_in):
    rollout = evil_rollout(Rollout.Status.SUCCEEDED)
    response = signed_in.get(reverse("rollout_raw", args=[rollout.run_id, rollout.pk]))
    assert response["Content-Type"].startswith("application/json")
    assert response["X-Content-Type-Options"] == "nosniff"
    assert json.loads(response.content)[EVIL] == 2.0


@pytest.mark.django_db
def test_the_import_page_and_its_result_are_inert(signed_in):
    row = {
        "responses_create_params": {"input": EVIL},
        "reward": 1.0,
        "response": {"id": EVIL, "model": EVIL, "output": [msg(EVIL), call(EVIL, EVIL, EVIL), {"type": EVIL}]},
        EVIL: EVIL,
    }
    upload = SimpleUploadedFile(f"{EVIL}.jsonl", json.dumps(row).encode())
    response = signed_in.post(reverse("import"), {"rollouts": upload, "name": EVIL})
    assert response.status_code == 302
    run = Run.objects.get()
    assert run.name == EVIL[:200]
    html = signed_in.get(reverse("import")).content.decode()  # shows the success message with the run name
    assert "Imported 1 rollout(s)" in html
    assert_inert(html)
    html = signed_in.get(reverse("rollout", args=[run.pk, run.rollouts.get().pk])).content.decode()
    assert_inert(html)


@pytest.mark.django_db
def test_an_import_error_naming_an_evil_file_is_inert(signed_in):
    upload = SimpleUploadedFile(
        f"{EVIL}.jsonl", f'{{"responses_create_params": {{"input": "x"}}, "reward": "{SCRIPT}"}}\n'.encode()
    )
    response = signed_in.post(reverse("import"), {"rollouts": upload, "name": EVIL})
    html = response.content.decode()
    assert response.status_code == 400 and "line 1" in html
    assert_inert(html)
    assert Run.objects.count() == 0


def test_the_pretty_json_filter_escapes_what_it_returns():
    assert "<script>" not in pretty_json(json.dumps({"a": SCRIPT}))
    assert "&lt;img src=x onerror" in pretty_json(IMG)
    assert "&quot;" in pretty_json({"k": '"'})


def test_no_template_or_view_of_the_trajectory_marks_data_safe():
    files = [
        REPO / "rollouts" / "web" / "trajectory_views.py",
        REPO / "rollouts" / "web" / "items.py",
        REPO / "rollouts" / "web" / "navigation.py",
        REPO / "rollouts" / "web" / "import_views.py",
        REPO / "rollouts" / "collection" / "importer.py",
        REPO / "rollouts" / "templatetags" / "gymweb_tags.py",
        REPO / "gymweb" / "templates" / "rollouts" / "rollout_detail.html",
        REPO / "gymweb" / "templates" / "rollouts" / "import.html",
        *sorted((REPO / "gymweb" / "templates" / "rollouts" / "partials").glob("item_*.html")),
        *sorted((REPO / "gymweb" / "templates" / "rollouts" / "partials").glob("rollout_*.html")),
    ]
    for path in files:
        text = path.read_text()
        for bad in ("|safe", "mark_safe", "autoescape off", "safeseq", "SafeString"):
            assert bad not in text, f"{path.name} uses {bad}"


@pytest.mark.django_db
def test_texts_cut_for_display_stay_escaped_wherever_the_cut_falls(signed_in, settings):
    settings.GYMWEB_DISPLAY_MAX_CHARS = 40
    run = make_run(EVIL)
    task = make_task(run, row={"responses_create_params": {"input": "x" * 38 + EVIL}})
    items = [(0, msg("y" * (40 - k) + EVIL), {}) for k in range(1, 12)]
    items += [
        (0, call("c1", EVIL * 50, EVIL * 10), {"asked": True}),
        (0, out("c1", EVIL * 10), {"origin": "gym", "refused": True}),
        (1, {"type": EVIL, "data": EVIL * 10}, {}),
    ]
    rollout = make_rollout(
        run,
        task,
        status=Rollout.Status.SUCCEEDED,
        calls=[{}, {}],
        items=items,
        verify={"reward": 1.0, "note": EVIL * 10, "reward_components": {"why": EVIL * 10}},
    )
    html = signed_in.get(reverse("rollout", args=[run.pk, rollout.pk])).content.decode()
    assert "more characters" in html and "&lt;" in html
    assert_inert(html)
    assert "<scr" not in html.replace('<script src="/static/', "")


# -- Markdown: message text is rendered as Markdown, then sanitised by nh3 -------------------------
MD_PAYLOADS = [
    "[a](javascript:alert(1))",
    "[b](JaVaScRiPt:alert(1))",
    "[c](  javascript:alert(1)  )",
    "[d](java\tscript:alert(1))",
    "[e](&#106;&#97;&#118;&#97;&#115;&#99;&#114;&#105;&#112;&#116;&#58;alert(1))",
    "[f](&#x6A;avascript:alert(1))",
    "[g](javascript&colon;alert(1))",
    "[h](vbscript:msgbox(1))",
    "[i](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "![j](data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+)",
    '![k](x" onerror="alert(1))',
    "![l](javascript:alert(1))",
    "<img src=x onerror=alert(1)>",
    "**<img src=x onerror=alert(1)>**",
    "```html\n<script>alert(1)</script>\n<img src=x onerror=alert(1)>\n```",
    "    <script>alert(1)</script>",
    "`<img src=x onerror=alert(1)>`",
    "<svg onload=alert(1)><script>alert(1)</script></svg>",
    '<svg><a xlink:href="javascript:alert(1)"><text>x</text></a></svg>',
    "<javascript:alert(1)>",
    '<http://example.com/" onmouseover="alert(1)>',
    '<mailto:a@b.c?body="><img src=x onerror=alert(1)>>',
    "[m][r1]\n\n[r1]: javascript:alert(1)",
    '[n][r2]\n\n[r2]: <javascript:alert(1)> "t"',
    "[o][r3]\n\n[r3]: data:text/html,<script>alert(1)</script>",
    '<a href="javascript:alert(1)">p</a>',
    "<details open ontoggle=alert(1)>q</details>",
    '<div hx-get="/x" hx-trigger="load">r</div>',
    '[s](/x "\\" onmouseover=alert(1) \\"")',
    "<think><img src=x onerror=alert(1)><script>alert(1)</script></think>after",
    "| t | <img src=x onerror=alert(1)> |\n|---|---|\n| <svg onload=alert(1)> | [u](javascript:alert(1)) |",
    '<style>body{display:none}</style><iframe src="javascript:alert(1)"></iframe>',
    "<!-- <img src=x onerror=alert(1)> -->",
]
_BAD_URL = re.compile(r"^\s*(javascript|vbscript|data|file):", re.I)


def assert_markdown_inert(html: str) -> None:
    """No element, attribute or URL a payload asked for survives: only the page's own tags."""
    assert_inert(html)
    tags = re.findall(r"<[a-zA-Z][^>]*>", html)
    assert tags
    for tag in tags:
        name = tag[1:].split(None, 1)[0].rstrip(">").lower()
        if tag.startswith('<svg class="wf" '):  # the outline's own waterfall bars
            continue
        assert name not in ("img", "svg", "iframe", "object", "embed", "style", "math", "base"), tag
        assert not re.search(r"\son[a-z]+\s*=", tag, re.I), tag
        assert " style=" not in tag and "xlink:" not in tag, tag
        for url in re.findall(r'\s(?:href|src|action)="([^"]*)"', tag):
            assert not _BAD_URL.match(url), tag
        if name == "script":
            assert 'src="/static/' in tag, tag


@pytest.mark.django_db
def test_markdown_payloads_in_every_place_that_renders_markdown_are_inert(signed_in):
    run = make_run()
    task = make_task(
        run,
        row={
            "responses_create_params": {
                "instructions": "\n\n".join(MD_PAYLOADS),
                "input": [{"role": "user", "content": p} for p in MD_PAYLOADS],
            }
        },
    )
    items = [(0, msg(p), {}) for p in MD_PAYLOADS]
    items += [(0, msg(p, role="user"), {}) for p in MD_PAYLOADS]
    items += [(0, {"type": "reasoning", "summary": [{"type": "summary_text", "text": p}]}, {}) for p in MD_PAYLOADS]
    items += [
        (0, call("c1", "bash", json.dumps({"command": p, "query": p, "x": json.dumps({"y": p})})), {"asked": True})
        for p in MD_PAYLOADS
    ]
    items += [(0, out("c1", p), {"origin": "gym", "tool_status": 200}) for p in MD_PAYLOADS]
    items += [
        (0, out("c1", json.dumps({"p": p, "q": json.dumps([p])})), {"origin": "gym", "tool_status": 200})
        for p in MD_PAYLOADS
    ]
    verify = {
        "reward": 1.0,
        "fields": {f"k{i}": p for i, p in enumerate(MD_PAYLOADS)},
        "patch": "--- a\n+++ b\n@@ -1 +1 @@\n-" + SCRIPT + "\n+" + IMG,
    }
    rollout = make_rollout(run, task, calls=[{}], items=items, verify=verify)
    response = signed_in.get(reverse("rollout", args=[run.pk, rollout.pk]))
    html = response.content.decode()
    assert response.status_code == 200
    assert "<table>" in html and "<pre><code>" in html  # Markdown did render
    assert_markdown_inert(html)
    base = reverse("rollout_item", args=[run.pk, rollout.pk, "input"])[: -len("input/")]
    for key in ("0", str(len(MD_PAYLOADS)), "instructions", "input-0", "verify"):
        for query in ("full=1", "view=plain", "full=1&view=plain"):
            fragment = signed_in.get(f"{base}{key}/?{query}", HTTP_HX_REQUEST="true").content.decode()
            assert_markdown_inert(fragment)
            assert_markdown_inert(signed_in.get(f"{base}{key}/?{query}").content.decode())


def test_the_sanitiser_keeps_safe_links_and_drops_everything_else():
    from rollouts.web.rendering import item_body

    html = str(
        item_body(
            msg("[ok](https://example.com/a?b=1) [rel](/runs/) [mail](mailto:a@b.c) " + " ".join(MD_PAYLOADS)),
            "message",
            max_chars=100_000,
        ).html
    )
    assert '<a href="https://example.com/a?b=1" rel="noopener noreferrer nofollow">ok</a>' in html
    assert '<a href="/runs/" rel="noopener noreferrer nofollow">rel</a>' in html and 'href="mailto:a@b.c"' in html
    hrefs = re.findall(r'href="([^"]*)"', html)
    assert all(h.startswith(("https://", "http://", "/", "mailto:")) for h in hrefs), hrefs
    assert_markdown_inert(html)


def test_only_the_rendering_module_marks_content_safe_and_only_in_its_sanitiser():
    web = REPO / "rollouts" / "web"
    text = (web / "sanitiser.py").read_text()
    assert text.count("mark_safe(") == 1
    sanitiser = text[text.index("def sanitise(") :]
    assert "mark_safe(" in sanitiser and "_CLEANER.clean(markup)" in sanitiser
    names = ("rendering", "markup", "markdown_text", "diffs", "json_tree")
    builders = [(web / f"{name}.py").read_text() for name in names]
    assert not any("mark_safe(" in builder for builder in builders)
    for bad in ("|safe", "autoescape off", "safeseq", "SafeString("):
        assert all(bad not in t for t in [text, *builders])


def test_payloads_in_highlighted_code_fences_and_commands_are_inert(signed_in):
    run = make_run()
    fences = [
        f"```{lang}\n{p}\n```" for lang in ("python", "bash", "html", "js", "diff", "nosuchlang") for p in MD_PAYLOADS
    ]
    items = [(0, msg(f), {}) for f in fences]
    items += [
        (0, call("c1", "run", json.dumps({"command": p, "code": p, "sql": p, "script": p})), {"asked": True})
        for p in MD_PAYLOADS
    ]
    rollout = make_rollout(run, make_task(run), calls=[{}], items=items)
    html = signed_in.get(reverse("rollout", args=[run.pk, rollout.pk])).content.decode()
    assert 'class="code hl"' in html and 'class="hl-' in html  # highlighting did run
    assert_markdown_inert(html)
    base = reverse("rollout_item", args=[run.pk, rollout.pk, "input"])[: -len("input/")]
    for key in ("0", str(len(MD_PAYLOADS)), str(len(fences))):
        assert_markdown_inert(signed_in.get(f"{base}{key}/?full=1", HTTP_HX_REQUEST="true").content.decode())


def test_the_highlighter_is_a_builder_that_never_marks_anything_safe():
    text = (REPO / "rollouts" / "web" / "highlight.py").read_text()
    assert "mark_safe" not in text and "SafeString" not in text
