"""The env parser: typed values from strings (tests/unit/test_config.py covers the job's own sections)."""

from __future__ import annotations

from dataclasses import dataclass

from firehose_bq import settings
from firehose_bq.settings import Secret, setting


@dataclass(frozen=True)
class _Section:
    """A section with no __post_init__: whatever type a field has, the parser alone gave it."""

    token: Secret | None = setting("TEST_TOKEN", "A secret.", None)
    name: str = setting("TEST_NAME", "Not a secret.", "n")


def test_a_setting_typed_secret_is_parsed_into_a_secret() -> None:
    problems: list[str] = []
    section = settings.load_section(_Section, {"TEST_TOKEN": " s3cr3t ", "TEST_NAME": "x"}, problems)
    assert problems == []
    assert isinstance(section.token, Secret) and section.token.reveal() == "s3cr3t"
    assert "s3cr3t" not in repr(section) and section.name == "x"
    assert settings.load_section(_Section, {}, problems) == _Section(token=None)
