"""The emulator patches stay documented: each module names a BigQuery behaviour and a test that exists,
and the launcher applies every one of them."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from decimal import Decimal
from pathlib import Path

from firehose_bq.devstack import bqemulator_patches

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "firehose_bq" / "devstack" / "bqemulator_launcher.py"
# Helpers the patches share; they restore nothing themselves.
SHARED = {"_targets", "_bq_types", "row_values"}


def patch_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(bqemulator_patches.__path__) if m.name not in SHARED)


def test_every_patch_names_tests_that_exist() -> None:
    for name in patch_modules():
        doc = importlib.import_module(f"{bqemulator_patches.__name__}.{name}").__doc__ or ""
        assert "BigQuery" in doc and "Shown by" in doc, f"{name}: say which BigQuery behaviour, shown by which test"
        shown = doc[doc.index("Shown by"):]
        files = re.findall(r"(tests/integration/\w+\.py)", shown)
        tests = re.findall(r"::(test_\w+)", shown)
        assert files and tests, f"{name}: name the test file and test"
        defined = {n.name for f in files for n in ast.walk(ast.parse((REPO / f).read_text()))
                   if isinstance(n, ast.FunctionDef)}
        assert set(tests) <= defined, f"{name}: {set(tests) - defined} not found in {files}"


def test_the_launcher_applies_every_patch_and_each_has_an_apply() -> None:
    launcher = LAUNCHER.read_text()
    for name in patch_modules():
        assert callable(importlib.import_module(f"{bqemulator_patches.__name__}.{name}").apply)
        assert f"{name}.apply" in launcher, f"the launcher does not apply {name}"


def test_insert_all_accepts_numerics_wider_than_decimals_default_precision() -> None:
    """NUMERIC holds 29 integer digits at scale 9 (38 in all): 2^64-1 (a uint64 column as NUMERIC) is one."""
    from types import SimpleNamespace

    from firehose_bq.devstack.bqemulator_patches.row_values import validate_row

    # bqemulator's TableFieldSchema, as the module takes it
    fields = [SimpleNamespace(name=n, type=t, mode="NULLABLE", fields=[]) for n, t in (("n", "NUMERIC"), ("b", "BIGNUMERIC"))]
    biggest = "9" * 29 + "." + "9" * 9
    row, error = validate_row({"n": 2**64 - 1, "b": "1" * 38 + "." + "1" * 38}, fields, ignore_unknown=False)
    assert error is None and row is not None and row["n"] == Decimal(2**64 - 1)
    row, error = validate_row({"n": biggest}, fields, ignore_unknown=False)
    assert error is None and row is not None and str(row["n"]) == biggest
    row, error = validate_row({"n": "1" + "0" * 29}, fields, ignore_unknown=False)  # 30 integer digits
    assert row is None and error is not None and "Invalid NUMERIC value" in error.message


def test_a_json_column_refuses_a_number_beyond_float64_as_bigquery_does() -> None:
    from types import SimpleNamespace

    from firehose_bq.devstack.bqemulator_patches.json_column_numbers import holds_number_beyond_float64
    from firehose_bq.devstack.bqemulator_patches.row_values import validate_row

    assert [holds_number_beyond_float64(t) for t in ('{"a": [1e400]}', "-1" + "0" * 309, "1e308", '"1e400"', "1e")] \
        == [True, True, False, False, False]
    fields = [SimpleNamespace(name="j", type="JSON", mode="NULLABLE", fields=[])]
    for value in ('{"a": 1e400}', {"a": 10 ** 400}):
        row, error = validate_row({"j": value}, fields, ignore_unknown=False)
        assert row is None and error is not None and "out of FLOAT64 range" in error.message
    row, error = validate_row({"j": '{"a": 18446744073709551616}'}, fields, ignore_unknown=False)
    assert error is None and row == {"j": '{"a": 18446744073709551616}'}
