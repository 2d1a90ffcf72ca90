"""Security headers and CSP-safe markup on every page, through the test client with the demo
data loaded: a Content Security Policy without 'unsafe-inline', nosniff, a Referrer-Policy;
no inline scripts, styles or event handler attributes; no character that needs an emoji font;
API docs behind login with local assets; production refuses a missing SECRET_KEY."""

import json
import re
import shutil
import subprocess
import sys

import pytest
from django.contrib.auth.models import User
from django.test import Client

from convoys.models import Convoy
from convoys.services.tokens import create_token

from .support.pages import inline_code, needs_emoji_font, page_urls
from .support.paths import ROOT
from .support.users import logged_in


def assert_security_headers(response, url):
    policy = dict(
        (part.split(" ", 1) + [""])[:2] for part in response["Content-Security-Policy"].split("; ")
    )
    assert "'unsafe-inline'" not in response["Content-Security-Policy"], url
    assert "'unsafe-eval'" not in response["Content-Security-Policy"], url
    assert policy["default-src"] == "'self'", url
    assert policy["script-src"] == "'self'", url
    assert policy["style-src"] == "'self'", url
    assert policy["object-src"] == "'none'", url
    assert policy["frame-ancestors"] == "'none'", url
    assert response["X-Content-Type-Options"] == "nosniff", url
    assert response["Referrer-Policy"] == "same-origin", url
    assert response["X-Frame-Options"] == "DENY", url
    assert response["Cross-Origin-Opener-Policy"] == "same-origin", url


def test_every_page_sends_the_security_headers(demo):
    client = logged_in(demo)
    for url in page_urls():
        response = client.get(url)
        assert response.status_code == 200, url
        assert_security_headers(response, url)
    anonymous = Client()
    for url in ["/login/", "/api/openapi.json", "/"]:
        assert_security_headers(anonymous.get(url), url)
    assert_security_headers(logged_in(User.objects.create_user("nobody")).get("/"), "403")
    # Scripts and styles are never sniffed into another type either.
    for url in [
        "/static/convoys/live.js",
        "/static/convoys/app.css",
        "/static/ninja/swagger-ui.css",
    ]:
        response = anonymous.get(url)
        assert response.status_code == 200 and response["X-Content-Type-Options"] == "nosniff"


def test_pages_have_no_inline_code(demo):
    client = logged_in(demo)
    for url in [*page_urls(), "/login/"]:
        assert inline_code(client.get(url).text).found == [], url


def fonts_covering(char):
    result = subprocess.run(
        ["fc-list", f":charset={ord(char):x}", "family"], capture_output=True, text=True
    )
    return {f for f in result.stdout.splitlines() if f and "emoji" not in f.lower()}


def test_no_template_has_inline_code():
    """Every branch of every template, not only the ones the pages above happened to draw."""
    for path in sorted((ROOT / "templates").rglob("*.html")):
        assert inline_code(path.read_text()).found == [], path.relative_to(ROOT)


def test_pages_and_icons_need_no_emoji_font(demo):
    client = logged_in(demo)
    used = set()
    for url in [*page_urls(), "/login/"]:
        html = client.get(url).text
        assert needs_emoji_font(html) == [], url
        used |= {c for c in html if ord(c) > 127}
    # Scripts write text too (toasts, the live state): the same rule for them and the images.
    static = ROOT / "static" / "convoys"
    for path in sorted(p for p in static.iterdir() if p.suffix in (".js", ".svg")):
        text = path.read_text()
        assert needs_emoji_font(text) == [], path.name
        used |= {c for c in text if ord(c) > 127}
    if shutil.which("fc-list"):
        # Every symbol on our pages is drawn by an ordinary font installed here (Debian's
        # Chromium pulls in DejaVu): no blank boxes on a machine without emoji or CJK fonts.
        missing = sorted(c for c in used if not fonts_covering(c))
        assert missing == [], [f"U+{ord(c):04X}" for c in missing]


def test_progress_bars_are_svg_rects_that_add_up(demo):
    html = logged_in(demo).get("/").text
    bars = re.findall(r'<svg class="bar".*?</svg>', html)
    assert len(bars) == Convoy.objects.count()
    for bar in bars:
        rects = re.findall(r'<rect class="seg (\w+)" x="([\d.]+)" width="([\d.]+)"', bar)
        assert rects, bar
        x = 0.0
        for _name, start, width in rects:
            assert float(start) == pytest.approx(x, abs=0.02)
            x += float(width)
        assert x == pytest.approx(100, abs=0.05)


def test_api_docs_and_schema_need_login(demo):
    anonymous = Client()
    docs = anonymous.get("/api/docs")
    assert docs.status_code == 302 and docs["Location"].startswith("/login/?next=/api/docs")
    schema = anonymous.get("/api/openapi.json")
    assert schema.status_code == 401 and schema.json() == {"detail": "Unauthorized"}
    bogus = anonymous.get("/api/openapi.json", headers={"Authorization": "Bearer cvw_nope"})
    assert bogus.status_code == 401

    token = create_token(demo, "docs")
    with_token = anonymous.get("/api/openapi.json", headers={"Authorization": f"Bearer {token}"})
    assert with_token.status_code == 200 and "/api/convoys" in with_token.json()["paths"]


def test_api_docs_assets_are_local_and_served(demo):
    client = logged_in(demo)
    page = client.get("/api/docs")
    assert page.status_code == 200
    # Nothing fetched from elsewhere, not even Swagger UI's online validator badge.
    settings = json.loads(re.search(r'id="swagger-settings">(.*?)</script>', page.text, re.S)[1])
    assert settings["validatorUrl"] is None
    sources = inline_code(page.text).script_src
    links = re.findall(r'<link[^>]+href="([^"]+)"', page.text)
    assert any("swagger-ui-bundle" in src for src in sources)
    for url in [*sources, *links]:
        assert url.startswith("/static/"), url
        asset = client.get(url)
        assert asset.status_code == 200, url
        body = b"".join(asset.streaming_content) if asset.streaming else asset.content
        # Swagger UI's own files are big (not an empty stand-in); our phone fixes are small.
        assert len(body) > (100 if url.startswith("/static/convoys/") else 1000), url


def test_the_ui_links_to_the_api_docs(demo):
    html = logged_in(demo).get("/").text
    assert html.count('href="/api/docs"') == 1


def manage_check(*args, **env):
    base = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT)}
    return subprocess.run(
        [sys.executable, "manage.py", "check", *args],
        cwd=ROOT,
        env=base | env,
        capture_output=True,
        text=True,
        timeout=120,
    )


DEVELOPMENT_KEY = "convoyweb-development-key-not-for-production-use-0123456789abcdef"


@pytest.mark.parametrize("debug", ["0", "1"])
@pytest.mark.parametrize("key", [None, "", "   ", DEVELOPMENT_KEY])
def test_production_refuses_a_missing_secret_key_whatever_debug_says(debug, key):
    env = {"CONVOY_PRODUCTION": "1", "DEBUG": debug}
    if key is not None:
        env["SECRET_KEY"] = key
    result = manage_check(**env)
    assert result.returncode != 0
    assert "SECRET_KEY must be set when CONVOY_PRODUCTION=1" in result.stderr


def test_production_environment_passes_the_deploy_checks():
    """The environment .ci/run uses, nothing but production, a key and a host:
    `check --deploy --fail-level WARNING` finds nothing."""
    result = manage_check(
        "--deploy",
        "--fail-level",
        "WARNING",
        CONVOY_PRODUCTION="1",
        DEBUG="0",
        SECRET_KEY="test-" + "k8Qz3vRt" * 8,
        ALLOWED_HOSTS="convoy.internal",
    )
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


PRODUCTION = {"CONVOY_PRODUCTION": "1", "SECRET_KEY": "test-" + "k8Qz3vRt" * 8}


def production_setting(name, **env):
    result = subprocess.run(
        [sys.executable, "-c", f"from django.conf import settings; print(repr(settings.{name}))"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "convoyweb.settings"} | env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize(
    "name,on,variable",
    [
        ("SECURE_SSL_REDIRECT", "True", "SECURE_SSL_REDIRECT"),
        ("SESSION_COOKIE_SECURE", "True", "SESSION_COOKIE_SECURE"),
        ("CSRF_COOKIE_SECURE", "True", "CSRF_COOKIE_SECURE"),
        ("SECURE_HSTS_SECONDS", "31536000", "SECURE_HSTS_SECONDS"),
    ],
)
def test_production_is_secure_by_default_and_each_can_be_turned_off(name, on, variable):
    assert production_setting(name, **PRODUCTION) == on
    assert production_setting(name, **PRODUCTION, **{variable: "0"}) in ("False", "0")
    assert production_setting(name) in ("False", "0")  # development: off


def test_signed_in_answers_are_never_stored(demo):
    client = logged_in(demo)
    for url in ["/", "/inbox/", "/api/convoys", "/api/docs", "/admin/"]:
        cache = client.get(url)["Cache-Control"]
        assert "no-store" in cache and "private" in cache, (url, cache)
    token = create_token(demo, "cache")
    api = Client().get("/api/beads", headers={"Authorization": f"Bearer {token}"})
    assert "no-store" in api["Cache-Control"] and "private" in api["Cache-Control"]
    # The login page keeps its own rules; static files are not touched.
    login = Client().get("/login/")["Cache-Control"]
    assert "no-cache" in login and "must-revalidate" in login
    static = client.get("/static/convoys/app.css")
    assert "no-store" not in static.get("Cache-Control", "")
