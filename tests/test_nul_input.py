"""A NUL character in any query or form value is refused with a 400 naming the field, before
any view or the admin reads it (PostgreSQL cannot even compare such text), and changes nothing."""

import pytest

from convoys.models import Convoy

from .factories import bead
from .test_web import logged_in

pytestmark = pytest.mark.django_db


def test_nul_in_a_query_or_form_is_refused_by_name(routes, admin_user):
    bead("gt-a")
    client = logged_in(admin_user)
    search = client.get("/admin/convoys/convoy/", {"q": "a\x00b"})
    assert search.status_code == 400
    assert search.content.decode() == "field 'q' contains a NUL character"
    launch = client.post("/stage/", {"ids": "gt-a\x00", "do": "launch"})
    assert launch.status_code == 400 and b"field 'ids'" in launch.content
    assert not Convoy.objects.exists()
    assert client.get("/admin/convoys/convoy/", {"q": "ab"}).status_code == 200
