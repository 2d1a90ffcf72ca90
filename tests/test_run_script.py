"""./run.sh --help answers with its usage and does nothing else (no install, no migrate)."""

import subprocess

from .support.paths import ROOT


def test_run_sh_help_prints_usage_and_does_nothing():
    for flag in ("--help", "-h"):
        result = subprocess.run(
            ["bash", str(ROOT / "run.sh"), flag], capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("usage: ./run.sh [--reset]")
        assert "PORT=9000" in result.stdout and "Following a real town" in result.stdout
        assert result.stderr == ""
