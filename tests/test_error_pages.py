"""No error page prints a database or Redis URL or password: the debug page's settings,
request headers and traceback frames are filtered (convoyweb/reporting.py)."""

import sys

from django.test import RequestFactory
from django.views.debug import ExceptionReporter

# Built from parts: the page shows this file's source lines, which must not hold them.
PASSWORD, REDIS_PASSWORD = "s3cret" + "-pw", "r3dis" + "-pw"
URL = f"postgres://convoy:{PASSWORD}@db.internal:5432/convoy"
REDIS = f"redis://:{REDIS_PASSWORD}@cache.internal:6379/0"


def test_the_debug_page_hides_connection_urls_and_passwords(settings):
    settings.DEBUG = True
    settings.DATABASE_URL = URL
    settings.REDIS_URL = REDIS
    settings.CACHES = {"default": {"BACKEND": "x", "LOCATION": REDIS}}
    request = RequestFactory().get("/", HTTP_X_DATABASE_URL=URL)
    try:
        conninfo = f"dbname=convoy password={PASSWORD}"  # noqa: F841 (a frame's local)
        raise RuntimeError("boom")
    except RuntimeError:
        html = ExceptionReporter(request, *sys.exc_info()).get_traceback_html()
    assert "boom" in html and "conninfo" in html  # the page itself is shown
    for secret in (PASSWORD, REDIS_PASSWORD, URL, REDIS):
        assert secret not in html, secret
