"""Values that reach the dispatch command are safe.

Rig names and route prefixes keep to ASCII letters, digits and '-._' at every entry; a
template that runs a shell is refused unless the operator opts in, and then every value is
shell-quoted. Each hostile value carries a command creating a marker file: the intended
command receives it as one literal argument and the marker never appears."""

import json
import stat
import sys

import pytest
from django.core.management.base import CommandError

from convoys.infra.dispatchers import CommandDispatcher
from convoys.models import Bead, Rig, Route
from convoys.services import rigs, sling
from convoys.services.errors import ServiceError

from .support.factories import bead, command


def hostile(marker):
    """Names that would run `touch MARKER` if a shell read them unquoted."""
    touch = f"touch {marker}"
    return [
        f"gastown;{touch}",
        f"$({touch})",
        f"`{touch}`",
        f"a b; {touch}",
        f"'; {touch}; '",
        f'"; {touch}; "',
        f"x\n{touch}",
        f"x|{touch}",
        f"x && {touch} &",
        f"$(printf x){{rig}}; {touch}",
    ]


@pytest.fixture
def recorder(tmp_path):
    """(argv file, the command writing its arguments there as JSON)."""
    out = tmp_path / "argv.json"
    script = tmp_path / "record.py"
    script.write_text("import json, sys\njson.dump(sys.argv[2:], open(sys.argv[1], 'w'))\n")
    return out, f"{sys.executable} {script} {out} {{bead}} {{rig}} {{convoy}} {{worker}}"


@pytest.fixture
def fake_ssh(tmp_path):
    """A stand-in for ssh: like ssh it drops the host and hands the rest, joined by spaces,
    to a shell."""
    path = tmp_path / "bin" / "ssh"
    path.parent.mkdir()
    path.write_text('#!/bin/sh\nshift\nexec sh -c "$*"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def templates(recorder, fake_ssh):
    _, inner = recorder
    return {
        "sh -c": f"sh -c '{inner}'",
        "ssh": f"{fake_ssh} build-host {inner}",
    }


@pytest.mark.parametrize("value", range(10), ids=lambda i: f"hostile{i}")
@pytest.mark.parametrize("kind", ["sh -c", "ssh"])
def test_hostile_values_through_a_shell_reach_the_command_literally(
    tmp_path, recorder, fake_ssh, kind, value
):
    marker = tmp_path / "marker"
    name = hostile(marker)[value]
    out, _ = recorder
    dispatcher = CommandDispatcher(templates(recorder, fake_ssh)[kind], shell=True)
    outcome = dispatcher.dispatch(name, name, name, f"{name}/polecats/nux")
    assert outcome.ok, outcome
    assert json.loads(out.read_text()) == [name, name, name, f"{name}/polecats/nux"]
    assert not marker.exists()


@pytest.mark.parametrize(
    "template",
    [
        "sh -c 'gt sling {bead} {rig}'",
        "/bin/bash -c 'gt sling {bead}'",
        "env dash -c 'gt sling {bead}'",
        "sudo -u gt zsh -c 'gt sling {bead}'",
        "ssh build-host gt sling {bead} {rig}",
        "timeout 30 /usr/bin/ssh -T build-host gt sling {bead}",
    ],
)
def test_a_shell_template_is_refused_unless_the_operator_opts_in(template, tmp_path):
    outcome = CommandDispatcher(template, shell=False).dispatch("gt-a", "gastown", "", "w")
    assert not outcome.ok
    assert "runs a shell" in outcome.error and "CONVOY_DISPATCH_SHELL=1" in outcome.error
    assert "\n" not in outcome.error
    assert CommandDispatcher(template, shell=True).argv("gt-a", "gastown", "", "w")


def test_without_a_shell_values_are_passed_unquoted(recorder, tmp_path):
    out, template = recorder
    name = hostile(tmp_path / "marker")[3]
    assert CommandDispatcher(template, shell=False).dispatch(name, name, name, name).ok
    assert json.loads(out.read_text()) == [name] * 4  # one argument each, no quotes added


def test_a_legacy_hostile_rig_through_sling_and_a_shell(
    routes, recorder, fake_ssh, tmp_path, settings
):
    """A rig row from before the rule, written directly, dispatched end to end."""
    marker = tmp_path / "marker"
    name = hostile(marker)[0]
    out, _ = recorder
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = templates(recorder, fake_ssh)["ssh"]
    settings.CONVOY_DISPATCH_SHELL = False
    Rig.objects.create(name=name)
    bead("gt-a")
    Bead.objects.filter(pk="gt-a").update(rig_id=name)
    _, _, results = sling.sling(["gt-a"], name, force=True)
    assert not results[0]["ok"] and "runs a shell" in results[0]["error"]
    assert not out.exists() and Bead.objects.get(pk="gt-a").status == "open"

    settings.CONVOY_DISPATCH_SHELL = True
    _, _, results = sling.sling(["gt-a"], name, force=True)
    assert results[0]["ok"], results
    bead_id, rig, _convoy, worker = json.loads(out.read_text())
    assert (bead_id, rig, worker) == ("gt-a", name, Bead.objects.get(pk="gt-a").assignee)
    assert not marker.exists()


BAD_NAMES = {
    "a;b": "character ';'",
    "$(id)": "not '$'",
    "x`id`": "character '`'",
    "a b": "character ' '",
    "a'b": 'character "\'"',
    'a"b': "character '\"'",
    "a\nb": "character '\\n'",
    "ñandú": "not 'ñ'",
    "-rf": "'-'",
    "..": "not '.'",
    "": "must not be empty",
}


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_the_services_and_the_cli_refuse_an_unsafe_rig_or_prefix(db, name):
    says = BAD_NAMES[name]
    with pytest.raises(ServiceError) as refused:
        rigs.create_rig(name)
    assert str(refused.value).startswith("rig name") and says in str(refused.value)
    if name:
        with pytest.raises(CommandError) as exc:
            command("rigs", "route", "--", "gt-", f"{name}/mayor/rig")
        assert says in str(exc.value) and "\n" not in str(exc.value)
        with pytest.raises(CommandError) as exc:
            command("rigs", "route", "--", f"{name}-", "gastown")
        assert "prefix" in str(exc.value) and "\n" not in str(exc.value)
    assert not Rig.objects.exists() and not Route.objects.exists()


def test_every_real_rig_and_prefix_shape_is_kept(db):
    for prefix, path in (("gt-", "gastown/mayor/rig"), ("bd-", "beads"), ("hq-cv-", ".")):
        rigs.upsert_route(prefix, path)
    rigs.create_rig("offline_brew.2")
    assert set(Rig.objects.values_list("name", flat=True)) == {"gastown", "beads", "offline_brew.2"}


@pytest.mark.parametrize("command_name", ["beads import", "beads sync"])
def test_an_odd_rig_in_routes_is_refused_at_import_with_file_line_and_field(
    db, tmp_path, command_name
):
    routes = tmp_path / "routes.jsonl"
    routes.write_text(
        '{"prefix":"gt-","path":"gastown/mayor/rig"}\n'
        '{"prefix":"x-","path":"my rig;reboot/mayor/rig"}\n'
    )
    issues = tmp_path / "issues.jsonl"
    issues.write_text('{"id":"gt-a","title":"t"}\n')
    args = (*command_name.split(), str(issues), "--routes", str(routes))
    with pytest.raises(CommandError) as exc:
        command(*args)
    message = str(exc.value)
    assert f"{routes}:2: field 'path': rig name 'my rig;reboot'" in message
    assert "character ' '" in message and "\n" not in message
    assert not Rig.objects.exists() and not Bead.objects.exists()


def test_an_odd_prefix_in_routes_is_refused_at_import(db, tmp_path):
    routes = tmp_path / "routes.jsonl"
    routes.write_text('{"prefix":"g$t-","path":"gastown"}\n')
    issues = tmp_path / "issues.jsonl"
    issues.write_text('{"id":"gt-a","title":"t"}\n')
    with pytest.raises(CommandError, match=r"routes.jsonl:1: field 'prefix': character '\$'"):
        command("beads", "import", str(issues), "--routes", str(routes))
    assert not Route.objects.exists() and not Bead.objects.exists()
