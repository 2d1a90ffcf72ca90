"""The docs hold together: relative links point at files that exist, the README stays a
five-minute read, and every variable settings.py reads is documented."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "bench" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def relative_links(path):
    text = CODE.sub("", FENCE.sub("", path.read_text()))
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor in the same page
        yield target.split("#", 1)[0]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file(path):
    assert path.exists()
    missing = [t for t in relative_links(path) if not (path.parent / t).exists()]
    assert missing == []


def test_the_readme_is_at_most_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_every_variable_settings_reads_is_in_the_configuration_doc():
    source = (ROOT / "convoyweb" / "settings.py").read_text()
    read = set(re.findall(r"env_[a-z]+\(\s*\"([A-Z][A-Z0-9_]+)\"", source))
    read |= set(re.findall(r"environ(?:\.get)?[(\[]\"([A-Z][A-Z0-9_]+)\"", source))
    assert len(read) > 30  # the patterns still find the settings
    documented = (ROOT / "docs" / "configuration.md").read_text()
    assert sorted(name for name in read if f"`{name}`" not in documented) == []
