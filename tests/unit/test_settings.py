"""The env parser: typed values from strings (tests/unit/test_config.py covers the job's own sections)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from firehose_bq import settings
from firehose_bq.errors import ConfigError
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


def test_an_env_file_reads_quotes_and_escapes_as_docker_compose_and_python_dotenv_do(tmp_path: Path) -> None:
    path = tmp_path / "a.env"
    path.write_text(
        'JAAS="org.apache.kafka.common.security.plain.PlainLoginModule required username=\\"u\\" password=\\"p\\\\q\\";"\n'
        "SINGLE='it\\'s \\n literal'  # a comment after the closing quote\n"
        'DOUBLE="a\\tb\\nc \\x # not a comment"\n'
        "BARE=v#1 # a comment after whitespace\n"
    )
    assert settings.read_env_file(path) == {
        "JAAS": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p\\q";',
        "SINGLE": "it's \\n literal",
        "DOUBLE": "a\tb\nc \\x # not a comment",
        "BARE": "v#1",
    }


@pytest.mark.parametrize("line", ['PASSWORD="s3cr3t', "PASSWORD='s3cr3t\\'", 'PASSWORD="s3cr3t" x'])
def test_an_unterminated_or_trailing_quote_names_the_line_not_its_value(tmp_path: Path, line: str) -> None:
    path = tmp_path / "a.env"
    path.write_text(f"A=1\n{line}\n")
    with pytest.raises(ConfigError, match=r"a\.env:2: PASSWORD: (no closing|text after)") as error:
        settings.read_env_file(path)
    assert "s3cr3t" not in str(error.value)
