"""The local stack is development tooling: it stays out of the wheel, and the CLI says so when it is absent."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from setuptools import find_packages

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_packages_leave_the_dev_stack_out() -> None:
    setuptools_cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = setuptools_cfg["packages"]["find"]
    packages = find_packages(str(REPO), include=find["include"], exclude=find["exclude"])
    assert "firehose_bq" in packages and "firehose_bq.dlq" in packages
    assert [p for p in packages if "devstack" in p] == []
    # With package data on, a checkout's stale egg-info (from `pip install -e`) adds devstack back as data.
    assert setuptools_cfg["include-package-data"] is False


def test_stack_commands_explain_that_the_dev_stack_comes_with_a_source_checkout() -> None:
    # An installed wheel has no firehose_bq.devstack; None in sys.modules makes its import fail the same way.
    script = ("import sys; sys.modules['firehose_bq.devstack'] = None; from firehose_bq import cli; "
              "sys.exit(cli.main(sys.argv[1:]))")
    for args in (["stack", "status"], ["config", "stack-reference"], ["table", "preview", "--stack"]):
        done = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 1, (args, done.stderr)
        assert "not part of the installed package" in done.stderr and "source checkout" in done.stderr
        assert "Traceback" not in done.stderr
