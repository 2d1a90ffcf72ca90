"""What an error page may show: Django's filter, which hides settings named like a key, a
token or a password, also hides the database's and Redis's URLs and passwords wherever they
are (a setting, a request header, a local variable of a traceback frame on the debug page)."""

import re
from collections.abc import ItemsView
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.http import HttpRequest
from django.views.debug import SafeExceptionReporterFilter


def connection_secrets() -> set[str]:
    """The database and Redis URLs and every password in them or in DATABASES."""
    urls = [getattr(settings, "DATABASE_URL", ""), getattr(settings, "REDIS_URL", "")]
    passwords = [urlsplit(url).password or "" for url in urls if url]
    passwords += [str(db.get("PASSWORD") or "") for db in settings.DATABASES.values()]
    return {secret for secret in [*urls, *passwords] if secret}


class HideConnectionSecrets(SafeExceptionReporterFilter):
    # Settings named like a URL or a server's address: DATABASE_URL, REDIS_URL, the cache's
    # LOCATION, the channel layer's "address", django-q's "redis".
    hidden_settings = re.compile(
        SafeExceptionReporterFilter.hidden_settings.pattern + "|URL|LOCATION|ADDRESS|REDIS",
        flags=re.I,
    )

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        return self._scrubbed(cleansed) if isinstance(cleansed, str) else cleansed

    def get_traceback_frame_variables(
        self, request: HttpRequest | None, tb_frame: Any
    ) -> ItemsView[str, Any]:
        # Whatever DEBUG says: a frame's connection parameters or URL never reach the page.
        variables = super().get_traceback_frame_variables(request, tb_frame)
        return {name: self._scrubbed(value) for name, value in variables}.items()

    def _scrubbed(self, value: Any) -> Any:
        try:
            text = value if isinstance(value, str) else repr(value)
        except Exception:  # a repr that fails is shown as Django shows it
            return value
        if any(secret in text for secret in connection_secrets()):
            return self.cleansed_substitute
        return value
