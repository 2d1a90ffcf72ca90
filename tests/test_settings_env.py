"""Configuration comes from environment variables; a bad value stops the process with one line
naming the variable and the value (not a bare ValueError from deep in settings.py)."""

import pytest

from .support.processes import child_env, manage


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "CONVOY_MAX_IN_FLIGHT",
            "abc",
            "CONVOY_MAX_IN_FLIGHT must be a whole number of at least 0, not 'abc'",
        ),
        (
            "CONVOY_MAX_IN_FLIGHT",
            "-1",
            "CONVOY_MAX_IN_FLIGHT must be a whole number of at least 0, not '-1'",
        ),
        (
            "CONVOY_MAX_IN_FLIGHT",
            "2.5",
            "CONVOY_MAX_IN_FLIGHT must be a whole number of at least 0, not '2.5'",
        ),
        ("CONVOY_WORKER_TIMEOUT", "soon", "CONVOY_WORKER_TIMEOUT must be a number, not 'soon'"),
    ],
)
def test_a_bad_number_names_the_variable(name, value, message):
    result = manage("check", env=child_env(**{name: value}))
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].endswith(message), result.stderr[-500:]


def test_good_numbers_pass():
    env = child_env(CONVOY_MAX_IN_FLIGHT="4", CONVOY_WORKER_TIMEOUT="2.5")
    result = manage("check", env=env)
    assert result.returncode == 0, result.stderr[-500:]
