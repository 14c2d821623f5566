"""Images the agent saw: ``input_image`` parts holding a base64 data URL of a known type are shown
as images (sized to fit, click to enlarge) instead of their base64 text; a remote image URL is a
link the browser never loads by itself; the page's Content-Security-Policy allows exactly
``data:`` images besides its own; the one sanitiser lets no other image or ``data:`` URL through."""

from __future__ import annotations

import base64
import re
import struct
import zlib
from pathlib import Path

import pytest
from django.urls import reverse

from rollouts.web.sanitiser import sanitise
from tests.test_view_rollout_detail import make_rollout, make_run, make_task, msg, out, page


def png(width: int = 40, height: int = 30) -> str:
    """A real PNG (a red rectangle) as a data URL."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    data = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(data).decode()


REMOTE = "https://images.example.org/track.png?user=alice"


def user_with_images(*urls):
    return {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "What is in these pictures?"}]
        + [{"type": "input_image", "image_url": u, "detail": "auto"} for u in urls],
    }


def _rollout(items):
    run = make_run()
    return make_rollout(run, make_task(run), calls=[{}], items=[(0, item, {}) for item in items])


@pytest.mark.django_db
def test_a_base64_png_is_shown_as_an_image_not_as_its_text(signed_in):
    url = png()
    html = page(signed_in, _rollout([user_with_images(url), msg("A red rectangle.")]))
    assert html.count(f'<img class="part-img" src="{url}" alt="image (png, ') == 1
    assert html.count(url[30:90]) == 1  # the base64 is nowhere else on the page (not as text)


@pytest.mark.django_db
def test_an_image_a_tool_returned_is_shown_too(signed_in):
    url = png(8, 8).replace("image/png", "image/webp")
    output = out("c1", [{"type": "input_text", "text": "screenshot"}, {"type": "input_image", "image_url": url}])
    html = page(signed_in, _rollout([output]))
    assert f'<img class="part-img" src="{url}"' in html


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url, shown",
    [
        ("data:image/svg+xml;base64," + base64.b64encode(b"<svg onload='alert(1)'/>").decode(), "image (svg+xml,"),
        ("data:text/html;base64,PHNjcmlwdD4=", "image (?,"),
        ("data:image/png;base64,not base64 at all!", "image (png,"),
    ],
)
def test_other_data_urls_are_named_never_inlined(signed_in, url, shown):
    html = page(signed_in, _rollout([user_with_images(url)]))
    assert shown in html and "not shown" in html
    assert f'src="{url}"' not in html and "<img" not in html.split('id="timeline"')[1]


@pytest.mark.django_db
def test_a_remote_image_url_is_a_link_never_an_image_the_browser_loads(signed_in):
    html = page(signed_in, _rollout([user_with_images(REMOTE)]))
    escaped = REMOTE.replace("&", "&amp;")
    assert re.search(
        rf'<span class="badge">remote image</span> <a href="{re.escape(escaped)}" rel="noopener noreferrer nofollow">',
        html,
    )
    assert "(not loaded: open the link to see it)" in html
    assert not re.search(r"<(img|image|source|video|iframe|object|embed)\b[^>]*images\.example\.org", html)
    assert not re.search(r"(src|srcset|poster|background)=\"[^\"]*images\.example\.org", html)


@pytest.mark.django_db
def test_the_policy_allows_exactly_data_images_besides_the_sites_own(signed_in):
    response = signed_in.get(reverse("rollout", args=[(r := _rollout([user_with_images(png())])).run_id, r.pk]))
    policy = {p.split()[0]: p.split()[1:] for p in response["Content-Security-Policy"].split(";") if p.strip()}
    assert sorted(policy["img-src"]) == ["'self'", "data:"]
    assert policy["default-src"] == ["'self'"]


def test_the_sanitiser_keeps_only_inline_raster_images_and_no_other_data_url():
    url = png(2, 2)
    assert sanitise(f'<img class="part-img" src="{url}" alt="x">') == f'<img class="part-img" src="{url}" alt="x">'
    assert "src" not in sanitise(f'<img src="{REMOTE}">')
    assert "src" not in sanitise('<img src="data:image/svg+xml;base64,PHN2Zz4=">')
    assert "href" not in sanitise('<a href="data:text/html;base64,PHNjcmlwdD4=">x</a>')
    assert "onerror" not in sanitise(f'<img src="{url}" onerror="alert(1)">')


@pytest.mark.django_db
def test_the_raw_view_of_an_image_item_shows_its_json(signed_in):
    url = png(2, 2)
    rollout = _rollout([user_with_images(url)])
    fragment = signed_in.get(
        reverse("rollout_item", args=[rollout.run_id, rollout.pk, "0"]) + "?view=plain", headers={"HX-Request": "true"}
    ).content.decode()
    assert "<img" not in fragment and "input_image" in fragment


def test_the_page_script_enlarges_an_image_on_click():
    script = (Path(__file__).resolve().parents[1] / "gymweb" / "static" / "gymweb" / "trajectory.js").read_text()
    assert 'closest("img.part-img")' in script and 'classList.toggle("enlarged")' in script
