"""/api/v1/docs in a real browser: Swagger UI draws every operation from gymweb's own static files
under the site's CSP (script-src 'self'), with no request leaving the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import CHROMIUM

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(120),
]


def test_the_api_docs_draw_every_operation_under_the_csp_from_local_files(browser, live_server):
    page = browser.new_page()
    requested, refused = [], []
    page.on("request", lambda r: requested.append(r.url))
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    page.goto(f"{live_server.url}/api/v1/docs")
    page.wait_for_selector(".opblock", timeout=20_000)
    assert page.locator(".opblock").count() >= 20  # every route of the API, drawn from openapi.json
    assert "gymweb API" in page.locator(".title").first.inner_text()
    assert requested and all(url.startswith(live_server.url) for url in requested), requested
    assert refused == []
