"""Declaring settings read from environment variables, and parsing them.

A setting is a dataclass field made with `setting(...)`: it carries its env name, default and
meaning. `load_section` builds a section (a frozen dataclass of settings) from an environment,
collecting every problem instead of stopping at the first; `reference_markdown` renders the docs
table. `config.py` holds the job's sections; other packages (e.g. `registry`) declare their own.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from firehose_bq.errors import ConfigError


class Secret:
    """A string whose repr and str are redacted (Spark plans, logs and tracebacks show settings)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def setting(
    env: str,
    doc: str,
    default: Any = dataclasses.MISSING,
    *,
    choices: tuple[str, ...] = (),
    minimum: int | None = None,
    maximum: int | None = None,
    formerly: tuple[str, ...] = (),
    empty_ok: bool = False,
) -> Any:
    """Declare a config field read from `env`; no default means the variable is required. `formerly`:
    earlier names of the variable, still read when `env` is not set (deployments keep working).
    `empty_ok`: set to the empty string, a string setting whose default is not empty takes it as its value
    (it means something: no JVM options, no error type); otherwise that is a configuration error."""
    meta = {"env": env, "doc": doc, "choices": choices, "minimum": minimum, "maximum": maximum,
            "formerly": formerly, "empty_ok": empty_ok}
    if default is dataclasses.MISSING:
        return field(metadata=meta)
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SettingDoc:
    env: str
    default: str
    doc: str
    required: bool
    formerly: tuple[str, ...] = ()


def reference(sections: tuple[type, ...]) -> list[SettingDoc]:
    """Every setting of `sections` in declaration order: the source of README's configuration tables."""
    docs = []
    for section in sections:
        for f in settings_of(section):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            required = default is dataclasses.MISSING
            docs.append(SettingDoc(f.metadata["env"], "" if required else _format_default(default),
                                   _doc_with_choices(f), required, f.metadata.get("formerly", ())))
    return docs


def settings_of(section: type) -> list[dataclasses.Field[Any]]:
    """The fields of `section` made with `setting`; a field without an env name is filled in by code (e.g. the
    DLQ producer's Kafka security, which is the source's)."""
    return [f for f in dataclasses.fields(section) if "env" in f.metadata]


def reference_markdown(sections: tuple[type, ...]) -> str:
    lines = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for d in reference(sections):
        default = "*(required)*" if d.required else (f"`{d.default}`" if d.default else "*(empty)*")
        lines.append(f"| `{d.env}` | {default} | {d.doc} |")
    return "\n".join(lines)


def read_env_file(path: Path) -> dict[str, str]:
    """Parse a `NAME=value` file (comments, blank lines, optional quotes) into a dict, as docker compose and
    python-dotenv read one: see `_env_value`."""
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not name.strip().isidentifier():
            raise ConfigError([f"{path}:{number}: expected NAME=value, got {raw!r}"])
        try:
            values[name.strip()] = _env_value(value.strip())
        except ValueError as exc:  # the line itself is not shown: it may hold a password
            raise ConfigError([f"{path}:{number}: {name.strip()}: {exc}"]) from None
    return values


# What a backslash escape in a double-quoted value means; any other `\x` stays as written.
_DOUBLE_QUOTED_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


def _env_value(value: str) -> str:
    """An env file's value. Double quotes: `\\"`, `\\\\`, `\\n`, `\\r`, `\\t` are escapes (a JAAS line's inner
    quotes, a newline); single quotes: literal but for `\\'`; unquoted: as written. After a closing quote, or after
    whitespace in an unquoted value, `#` starts a comment."""
    if value[:1] not in ("'", '"'):
        return re.split(r"\s#", value, maxsplit=1)[0].rstrip()
    quote, i = value[0], 1
    chars: list[str] = []
    while i < len(value):
        char = value[i]
        if char == "\\" and i + 1 < len(value):
            escaped = value[i + 1]
            if quote == '"':
                chars.append(_DOUBLE_QUOTED_ESCAPES.get(escaped, char + escaped))
            else:
                chars.append("'" if escaped == "'" else char + escaped)
            i += 2
            continue
        if char == quote:
            rest = value[i + 1:].strip()
            if rest and not rest.startswith("#"):
                raise ValueError(f"text after the closing {quote}: quote the whole value (not shown: it may be secret)")
            return "".join(chars)
        chars.append(char)
        i += 1
    raise ValueError(f"no closing {quote} (an escaped \\{quote} does not end the value; one value per line)")


# --- parsing -------------------------------------------------------------------------------------------


def load_section(cls: type, environ: Mapping[str, str], problems: list[str]) -> Any:
    hints = typing.get_type_hints(cls)
    before = len(problems)
    values = {}
    for f in settings_of(cls):
        env = _set_name(f.metadata, environ, problems)
        raw = (environ.get(env) or "").strip()
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        # An empty optional string is a value (e.g. metadata at the root); anything else empty is unset, as
        # is an empty value of a setting whose default is empty (a choice's, which '' is not among).
        if not raw and (required or hints[f.name] is not str or env not in environ or f.default == ""):
            if required:
                problems.append(f"{env}: required but not set ({f.metadata['doc']})")
            continue
        if not raw and f.default and not (f.metadata.get("empty_ok") or f.metadata["choices"]):
            # `NAME=` in an env file, or a template whose variable was unset: taken as the value, '' would
            # fail far from here (a DLQ topic named '', a Spark master '').
            problems.append(f"{env}: empty; unset it for the default ({f.default}) or give a value")
            continue
        try:
            values[f.name] = _parse(raw, hints[f.name], f.metadata)
        except ValueError as exc:
            problems.append(f"{env}: {exc}")
    if len(problems) > before:
        return None
    try:
        return cls(**values)
    except ConfigError as exc:  # a section's own cross-checks (__post_init__)
        problems.extend(exc.problems)
        return None


def _set_name(meta: Mapping[str, Any], environ: Mapping[str, str], problems: list[str]) -> str:
    """The name a setting is read under: its own, else the first of its former names that is set."""
    env = meta["env"]
    names = [n for n in (env, *meta.get("formerly", ())) if (environ.get(n) or "").strip()]
    if len({environ[n].strip() for n in names}) > 1:
        problems.append(f"{env}: set differently under its former name(s) too ({', '.join(names[1:])}); set one")
    return names[0] if names else env


def _parse(raw: str, annotation: Any, meta: Mapping[str, Any]) -> Any:
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    base = next(a for a in typing.get_args(annotation) if a is not type(None)) if optional else annotation
    if base is bool:
        lowered = raw.lower()
        if lowered not in ("true", "false"):
            raise ValueError(f"expected true or false, got {raw!r}")
        return lowered == "true"
    if base is int:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
        if meta["minimum"] is not None and value < meta["minimum"]:
            raise ValueError(f"must be at least {meta['minimum']}, got {value}")
        if meta["maximum"] is not None and value > meta["maximum"]:
            raise ValueError(f"must be at most {meta['maximum']}, got {value}")
        return value
    if typing.get_origin(base) is dict:
        pairs = {}
        for item in (i.strip() for i in raw.split(",") if i.strip()):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"expected key=value pairs, got {item!r}")
            pairs[key.strip()] = value.strip()
        return pairs
    if typing.get_origin(base) is tuple:
        items = tuple(item.strip() for item in raw.split(",") if item.strip())
        if not items:
            raise ValueError("expected at least one comma-separated value")
        return items
    if base is Secret:
        # Wrapped here, the one place a value leaves the environment: no section holds it as a plain str.
        return Secret(raw)
    if meta["choices"]:
        # Whatever its case, as Kafka reads its own (security.protocol, auto.offset.reset): a Firehose env
        # file's `sasl_ssl` worked there. The value is the choice's own spelling.
        chosen = [choice for choice in meta["choices"] if choice.lower() == raw.lower()]
        if not chosen:
            raise ValueError(f"expected one of {', '.join(meta['choices'])}, got {raw!r}")
        return chosen[0]
    return raw


def _format_default(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _doc_with_choices(f: dataclasses.Field[Any]) -> str:
    doc = f.metadata["doc"]
    if f.metadata["choices"]:
        doc += f" One of: {', '.join(f.metadata['choices'])}."
    if f.metadata.get("formerly"):
        doc += f" Formerly {', '.join(f'`{n}`' for n in f.metadata['formerly'])} (still read)."
    return doc
