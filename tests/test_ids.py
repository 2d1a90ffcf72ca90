"""Ids, rig names and assignees: one rule at every entry, every exit safe. Each original attack is reproduced here through the interface it came from."""

import io
import json
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from convoys.core import ids
from convoys.infra.dispatchers import CommandDispatcher
from convoys.models import Bead, Convoy, Dependency, Rig, TrackedBead
from convoys.services import beads, convoys, jsonl, rigs, sling
from convoys.services.errors import ServiceError
from convoys.services.tokens import create_token

from .support.factories import bead
from .support.users import PASSWORD

ATTACKS = {
    "cm2-$(id)": "character '$'",
    "gt-a/b": "character '/'",
    "gt-{rig}": "character '{'",
    "gt-{worker}": "character '{'",
    "--output=FILE": "must start with a letter or a digit",
    "-rf": "must start with a letter or a digit",
    "gt-a b": "character ' '",
    "gt-<script>": "character '<'",
    "gt-a:b": "character ':'",
    "..": "must start with a letter or a digit",
    "gt-a\x00b": "character '\\x00'",
    "gt-e\u0301": "normal form NFC",
    "gt-" + "x" * 253: "is 256 characters long (at most 255)",
}


NUL_OR_SURROGATE = r"contains (a NUL character|a lone surrogate|the control .* '\\x00')"


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def argv_recorder(tmp_path):
    """A dispatch command that writes the arguments it received, as JSON, to a file."""
    out = tmp_path / "argv.json"
    script = "import json, sys; json.dump(sys.argv[1:], open(sys.argv[1], 'w'))"
    template = f'{sys.executable} -c "{script}" {out} {{bead}} {{rig}} {{convoy}} {{worker}}'
    return out, template


@pytest.fixture
def admin_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser("boss", "boss@localhost", PASSWORD)
    client.force_login(admin)
    client.user = admin
    return client


def test_the_rule_keeps_every_real_id_shape_and_unicode():
    for good in ("gt-si8rq.10", "bd-3q6.5-1", "hq-cv-25qkg", "offlinebrew-x_1", "gt-ñandú.1"):
        assert ids.id_problem(good) is None
    assert ids.id_problem("Ω-" + "ж" * 253) is None  # 255 characters
    assert ids.convoy_id_problem("hq-cv-" + "x" * 58) is None  # 64
    assert "at most 64" in ids.convoy_id_problem("hq-cv-" + "x" * 59)


@pytest.mark.parametrize("bad_id,reason", ATTACKS.items(), ids=[repr(k)[:30] for k in ATTACKS])
def test_cli_create_refuses_hostile_ids_and_writes_nothing(db, bad_id, reason):
    with pytest.raises(CommandError) as exc:
        run("beads", "create", "Title", f"--id={bad_id}")
    assert reason in str(exc.value) and "\n" not in str(exc.value)
    assert not Bead.objects.exists()


def test_a_unicode_id_at_the_length_limit_works_everywhere(admin_client, routes):
    bead_id = "gt-ñandú." + "ж" * 246
    run("beads", "create", "Unicode", f"--id={bead_id}")
    out, _ = run("sling", bead_id, "--json")
    assert json.loads(out)["dispatched"][0]["ok"]
    url = reverse("bead", args=[bead_id])
    assert admin_client.get(url).status_code == 200
    convoy = Convoy.objects.get()
    assert admin_client.get(reverse("convoy", args=[convoy.pk])).status_code == 200
    assert admin_client.get("/").status_code == 200


@pytest.mark.parametrize(
    "args",
    [
        ("beads", "create", "T", "--assignee=-rf"),
        ("beads", "create", "T", "--assignee=--output=FILE"),
        ("beads", "create", "T", "--assignee=gastown/polecats/nux\n"),
        ("beads", "create", "T", "--prefix=$(id)-"),
        ("beads", "update", "gt-a", "--assignee=-rf"),
        ("beads", "update", "gt-a", "--assignee=a\u202eb"),
        ("beads", "heartbeat", "--", "-rf"),
        ("beads", "dep", "add", "gt-a", "gt-b\nc"),
        ("sling", "cm2-$(id)"),
        ("sling", "gt-a/b"),
        ("convoy", "create", "Work", "gt-a", "gt-b\x00"),
        ("convoy", "add", "CONVOY", "gt-\x1b[31m"),
        ("rigs", "route", "gt-", "--", "-rf/mayor/rig"),
        ("rigs", "route", "--", "$(id)-", "x"),
    ],
    ids=repr,
)
def test_cli_refuses_option_like_and_control_names(routes, args):
    convoy = convoys.create("Existing")
    bead("gt-a")
    args = tuple(convoy.pk if a == "CONVOY" else a for a in args)
    before = (Bead.objects.count(), Dependency.objects.count(), TrackedBead.objects.count())
    with pytest.raises(CommandError) as exc:
        run(*args)
    assert "\n" not in str(exc.value).strip()
    after = (Bead.objects.count(), Dependency.objects.count(), TrackedBead.objects.count())
    assert after == before
    assert Bead.objects.get(pk="gt-a").assignee == ""
    assert not Rig.objects.filter(name__startswith="-").exists()


def test_route_file_with_an_option_like_rig_is_a_line_error(db, tmp_path):
    routes = tmp_path / "routes.jsonl"
    routes.write_text('{"prefix":"gt-","path":"gastown"}\n{"prefix":"x-","path":"-rf/x"}\n')
    issues = tmp_path / "issues.jsonl"
    issues.write_text('{"id":"gt-a","title":"t"}\n')
    with pytest.raises(
        CommandError, match=r"routes.jsonl:2: field 'path': must not start with '-'"
    ):
        run("beads", "import", str(issues), "--routes", str(routes))
    assert not Rig.objects.exists() and not Bead.objects.exists()


def test_dispatcher_fills_each_placeholder_once(tmp_path):
    out, template = argv_recorder(tmp_path)
    result = CommandDispatcher(template).dispatch(
        "gt-{rig}{worker}{}", "{bead}", "hq-cv-{convoy}", "{rig}/polecats/nux"
    )
    assert result.ok, result
    assert json.loads(out.read_text())[1:] == [
        "gt-{rig}{worker}{}",
        "{bead}",
        "hq-cv-{convoy}",
        "{rig}/polecats/nux",
    ]


@pytest.mark.parametrize("field", ["bead", "rig", "convoy", "worker"])
def test_dispatcher_never_passes_a_value_as_an_option(tmp_path, field):
    out, template = argv_recorder(tmp_path)
    values = {"bead": "gt-a", "rig": "gastown", "convoy": "hq-cv-1", "worker": "gastown/p/nux"}
    values[field] = "--output=FILE"
    result = CommandDispatcher(template).dispatch(
        **{f"{k}_id" if k in ("bead", "convoy") else k: v for k, v in values.items()}
    )
    assert not result.ok and "starts with '-'" in result.error
    assert not out.exists()
    # an option the template itself writes stays an option, with the value inside it
    assert CommandDispatcher("tool --bead={bead}").argv("-x", "", "", "") == ["tool", "--bead=-x"]


def test_a_legacy_option_like_rig_never_reaches_the_command(routes, tmp_path, settings):
    """A rig row from before the rule (written directly): dispatch fails, the command never runs
    with it, and the bead is released."""
    out, template = argv_recorder(tmp_path)
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = template
    Rig.objects.create(name="--output=FILE")
    bead("gt-a")
    Bead.objects.filter(pk="gt-a").update(rig_id="--output=FILE")
    _, _, results = sling.sling(["gt-a"], "--output=FILE", force=True)
    assert not results[0]["ok"] and "starts with '-'" in results[0]["error"]
    assert not out.exists()
    assert Bead.objects.get(pk="gt-a").status == "open"


def test_nul_and_lone_surrogates_are_refused_by_every_service(routes):
    bead("gt-a")
    convoy = convoys.create("Fine", ["gt-a"])
    attempts = [
        lambda: beads.update_bead("gt-a", title="a\x00b"),
        lambda: beads.update_bead("gt-a", description="\udc80"),
        lambda: beads.close_bead("gt-a", reason="done\x00"),
        lambda: beads.create_bead("t\x00", bead_id="gt-b"),
        lambda: beads.create_bead("t", bead_id="gt-b", labels=["ok", "x\x00"]),
        lambda: convoys.create("Title \x00"),
        lambda: convoys.close(convoy.pk, reason="\ud800", force=True),
        lambda: rigs.upsert_route("gt-", "gastown/\x00"),
    ]
    for attempt in attempts:
        with pytest.raises(ServiceError, match=NUL_OR_SURROGATE):
            attempt()
    assert Bead.objects.get(pk="gt-a").title == "Bead gt-a"
    assert Convoy.objects.count() == 1 and Convoy.objects.get().status == "open"


def test_nul_through_the_api_is_refused_and_export_reimports(routes, client, tmp_path):
    from django.contrib.auth.models import User

    bead("gt-a")
    user = User.objects.create_superuser("api", "api@localhost", PASSWORD)
    auth = {"Authorization": f"Bearer {create_token(user, 'test')}"}
    for path, body in [
        ("/api/beads/gt-a", {"title": "a\x00b"}),
        ("/api/beads/gt-a", {"assignee": "a\x00b"}),
        ("/api/beads/gt-a", {"assignee": "-rf"}),
    ]:
        response = client.patch(path, json.dumps(body), "application/json", headers=auth)
        assert 400 <= response.status_code < 500, (body, response.content)
    response = client.post("/api/heartbeat", {"worker": "-rf"}, "application/json", headers=auth)
    assert 400 <= response.status_code < 500
    assert Bead.objects.get(pk="gt-a").title == "Bead gt-a"
    exported = tmp_path / "export.jsonl"
    run("beads", "export", "-o", str(exported))
    jsonl.import_file(exported)


def test_pages_survive_ids_with_slashes_from_older_databases(admin_client, routes):
    """Rows written before the rule (directly, as an older version's import did): '/' in a
    convoy id took down / and /stranded/; an external dependency with '/' broke the bead page."""
    bead("gt-a")
    beads.add_dependency("gt-a", "external:other:x/y")
    legacy = convoys.create("Legacy", ["gt-a"])
    Convoy.objects.filter(pk=legacy.pk).update(id="hq-cv-a/b")
    TrackedBead.objects.update(convoy_id="hq-cv-a/b")
    Bead.objects.create(
        id="gt-b/../c", title="Legacy", created_at=legacy.created_at, updated_at=legacy.created_at
    )
    for path in (
        "/",
        "/stranded/",
        "/convoys/hq-cv-a~2Fb/",
        "/beads/gt-a/",
        "/beads/gt-b~2F..~2Fc/",
    ):
        assert admin_client.get(path).status_code == 200, path
    page = admin_client.get("/beads/gt-a/").content.decode()
    assert 'href="/beads/x~2Fy/"' in page
    assert admin_client.get("/beads/x~2Fy/").status_code == 404
    assert reverse("convoy", args=["hq-cv-a/b"]) == "/convoys/hq-cv-a~2Fb/"
    graph = convoys.create("Graph", ["gt-a", "gt-b/../c", "external:other:x/y"])
    page = admin_client.get(reverse("convoy", args=[graph.pk])).content.decode()
    assert 'href="/beads/gt-b~2F..~2Fc/"' in page


def test_landing_mail_has_a_one_line_subject_for_a_multi_line_title(
    routes, django_capture_on_commit_callbacks, caplog
):
    """Real data has titles with newlines (hq-cv-e43wk): e-mail refuses them in a header."""
    from django.core import mail

    bead("gt-a")
    convoy = convoys.create(
        "Work:\nline two\r\n<b>&",
        ["gt-a"],
        notify="evil@example.com\nBcc: all@example.com, ops@example.com",
    )
    with django_capture_on_commit_callbacks(execute=True):
        convoys.notify_landing(convoy)  # the bad address is skipped, not retried forever
    assert [m.subject for m in mail.outbox] == ["🚚 Convoy landed: Work: line two <b>&"]
    assert [m.to for m in mail.outbox] == [["ops@example.com"]]
    assert not [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "gt-a" in mail.outbox[0].body
