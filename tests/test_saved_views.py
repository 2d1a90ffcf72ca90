"""Saved views from the page itself: a dashboard or stranded page's filters saved under a
name, opened by their link by another user with the same filters, one the user's default
(applied when the page is opened with no query; `?all=1` still shows everything), renamed,
deleted; names and odd requests refused with one line, nothing changed."""

import re

import pytest
from django.contrib.auth.models import User

from convoys.models import SavedView
from convoys.services import savedviews, staging
from convoys.services.errors import ServiceError
from convoys.services.launch import launch_staged

from .support.factories import bead
from .support.users import logged_in, user_with


@pytest.fixture
def town(routes):
    bead("gt-a", "Alpha work")
    bead("bd-b", "Beta work")
    first = staging.stage(["gt-a"], title="Alpha", actor="test").convoy_id
    second = staging.stage(["bd-b"], title="Beta", actor="test").convoy_id
    return first, second


def viewer_client(name):
    return logged_in(user_with(name, "view_convoy", "view_bead"))


def listed(page):
    return set(re.findall(r'<tr data-convoy="([^"]+)"', page))


def messages_of(response):
    """What the request added to the session's messages (those before it not shown yet)."""
    return [str(m) for m in response.wsgi_request._messages._queued_messages]


def save(client, page, name, query, **extra):
    return client.post("/views/save/", {"page": page, "name": name, "query": query, **extra})


def test_save_share_default_rename_and_delete_on_the_dashboard(town):
    alpha, beta = town
    ann = viewer_client("ann")
    everything = ann.get("/?status=all").content.decode()
    assert {alpha, beta} <= listed(everything)
    assert "No saved views yet" in everything

    # Save the filters shown: the page's hidden query is what the form sends.
    filtered = ann.get("/?status=all&q=Alpha&rig=&owner=").content.decode()
    query = re.search(r'name="query" value="([^"]*)"', filtered).group(1)
    assert query == "status=all&amp;q=Alpha"
    response = save(ann, "dashboard", "  Alpha only ", "status=all&q=Alpha&rig=")
    assert response.status_code == 302 and response["Location"] == "/?status=all&q=Alpha"
    view = SavedView.objects.get()
    assert (view.name, view.query, view.page) == ("Alpha only", "status=all&q=Alpha", "dashboard")
    page = ann.get(response["Location"]).content.decode()
    assert listed(page) == {alpha}
    assert f'href="/views/{view.pk}/" aria-current="page">Alpha only</a>' in page

    # Shared by its link: another user gets the same filters.
    bob = viewer_client("bob")
    opened = bob.get(f"/views/{view.pk}/", follow=True)
    assert opened.redirect_chain[-1][0] == "/?status=all&q=Alpha"
    assert listed(opened.content.decode()) == {alpha}
    # Bob cannot change Ann's view.
    response = bob.post(f"/views/{view.pk}/delete/")
    assert messages_of(response) == [f"saved view {view.pk} not found among yours"]
    assert SavedView.objects.filter(pk=view.pk).exists()

    # The default: the dashboard opened with no query shows it; ?all=1 shows everything.
    ann.post(f"/views/{view.pk}/default/", {"on": "1"})
    assert SavedView.objects.get(pk=view.pk).default
    response = ann.get("/")
    assert response.status_code == 302 and response["Location"] == "/?status=all&q=Alpha"
    assert bob.get("/").status_code == 200  # only Ann's default
    page = ann.get("/?all=1").content.decode()
    assert listed(page) == listed(bob.get("/").content.decode())  # as without a default
    assert ">default</span>" in page

    # Rename; a second default replaces the first.
    ann.post(f"/views/{view.pk}/rename/", {"name": "Alpha convoys", "next": "/?all=1"})
    assert SavedView.objects.get(pk=view.pk).name == "Alpha convoys"
    other = savedviews.save(ann_user(), "dashboard", "Beta", "status=all&q=Beta").view
    ann.post(f"/views/{other.pk}/default/", {"on": "1"})
    assert list(SavedView.objects.filter(default=True).values_list("name", flat=True)) == ["Beta"]
    assert ann.get("/")["Location"] == "/?status=all&q=Beta"
    ann.post(f"/views/{other.pk}/default/", {"on": "0"})
    assert ann.get("/").status_code == 200

    # Delete: its link is gone.
    response = ann.post(f"/views/{view.pk}/delete/", {"next": "/?all=1"})
    assert response["Location"] == "/?all=1"
    assert not SavedView.objects.filter(pk=view.pk).exists()
    assert bob.get(f"/views/{view.pk}/").status_code == 404


def ann_user():
    return User.objects.get(username="ann")


def test_saved_views_of_the_stranded_page(town):
    alpha, beta = town
    for convoy_id in town:
        staging_launch(convoy_id)
    ann = viewer_client("ann")
    page = ann.get("/stranded/?q=beta").content.decode()
    assert beta in page and alpha not in page
    assert 'id="stranded-filters"' in page and 'id="saved-views"' in page
    response = save(ann, "stranded", "Beta stranded", "q=beta&kind=&status=all")
    assert response["Location"] == "/stranded/?q=beta"  # only the page's own filters
    view = SavedView.objects.get(page="stranded")
    bob = viewer_client("bob")
    opened = bob.get(f"/views/{view.pk}/", follow=True).content.decode()
    assert beta in opened and alpha not in opened
    ann.post(f"/views/{view.pk}/default/", {"on": "1"})
    assert ann.get("/stranded/")["Location"] == "/stranded/?q=beta"
    everything = ann.get("/stranded/?all=1").content.decode()
    assert alpha in everything and beta in everything
    # The dashboard's default is apart from the stranded page's.
    assert ann.get("/").status_code == 200
    ann.post(f"/views/{view.pk}/delete/")
    assert ann.get("/stranded/").status_code == 200


def staging_launch(convoy_id):
    launch_staged(convoy_id, actor="test", force=True)


@pytest.mark.parametrize(
    "name,words",
    [
        ("", "name: give the view a name"),
        ("   ", "name: give the view a name"),
        ("x" * 81, "name: at most 80 characters"),
        ("two\nlines", "name: one line"),
        ("tab\there", "name: one line"),
        ("nul\x00", "name: contains a NUL"),
    ],
)
def test_bad_names_are_refused_with_one_line(town, name, words):
    ann = viewer_client("ann")
    response = save(ann, "dashboard", name, "status=all", next="/?status=all")
    assert response.status_code == 302 and response["Location"] == "/?status=all"
    said = messages_of(response)
    assert len(said) == 1 and said[0].startswith(words) and "\n" not in said[0]
    assert not SavedView.objects.exists()


def test_odd_requests_change_nothing(town):
    ann = viewer_client("ann")
    view = savedviews.save(ann_user(), "dashboard", "Mine", "status=open").view
    response = save(ann, "elsewhere", "x", "")
    assert "page: one of dashboard, stranded" in messages_of(response)[0]
    response = save(ann, "dashboard", "long", "q=" + "x" * 3000)
    assert "query: at most 2000" in messages_of(response)[0]
    response = ann.post("/views/99999999999999999999999/delete/")
    assert "not found" in messages_of(response)[0]
    assert ann.get("/views/99999999999999999999999/").status_code == 404
    assert ann.post(f"/views/{view.pk}/explode/").status_code == 404
    assert ann.get(f"/views/{view.pk}/delete/").status_code == 405
    savedviews.save(ann_user(), "dashboard", "Other", "status=all")
    response = ann.post(f"/views/{view.pk}/rename/", {"name": "Other"})
    assert "already have a view named 'Other'" in messages_of(response)[0]
    assert sorted(SavedView.objects.values_list("name", "query")) == [
        ("Mine", "status=open"),
        ("Other", "status=all"),
    ]
    # Saving a name again replaces its filters.
    assert not savedviews.save(ann_user(), "dashboard", "Mine", "status=closed").created
    assert SavedView.objects.get(name="Mine").query == "status=closed"
    with pytest.raises(ServiceError, match="query: q contains a NUL"):
        savedviews.clean_query("dashboard", "q=a%00b")


def test_opening_a_view_needs_the_right_to_see_the_page(town):
    view = savedviews.save(
        user_with("owner", "view_convoy"), "dashboard", "Mine", "status=all"
    ).view
    nobody = logged_in(user_with("nobody"))
    response = nobody.get(f"/views/{view.pk}/")
    assert response.status_code == 403
