"""ASGI entry point: HTTP through Django, websockets through the convoy consumer."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "convoyweb.settings")
# The web process pools its PostgreSQL connections (ASGI must not keep persistent ones, and a
# new connection per query cannot take a reconnect storm of 1,000 sockets). Task clusters
# fork workers, which a pool does not survive, so the default is on here only.
os.environ.setdefault("DATABASE_POOL", "1")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from convoys.live.routing import websocket_urlpatterns  # noqa: E402
from convoys.live.wsgate import gate  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Same-origin (scheme, host and port) and logged-in users only: convoys/live/wsgate.py.
        "websocket": gate(URLRouter(websocket_urlpatterns)),
    }
)
