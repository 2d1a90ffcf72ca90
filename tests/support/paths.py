"""Where things are: the project root, the test fixtures, the real bead exports next to a clone
(`shared_file` skips a test where they are absent), and whether this is a CI run."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "beads"
FIXTURES = ROOT / "tests" / "fixtures"
IN_CI = os.environ.get("CI", "").lower() == "true"


def shared_file(name):
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared is not next to this clone)")
    return path
