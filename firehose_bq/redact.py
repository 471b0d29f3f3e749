"""Keeping credentials out of logs, errors and printed settings.

Two layers. At the source, every URL that goes into a message passes through `url()`: a registry URL may
carry a password (`https://user:pass@host`) or a token in its query string (`?token=...`, `?apikey=...`,
signed URLs), and which query parameter is the secret one cannot be known, so every query value goes.
As a safety net, `Redactor.text()` runs over every log line and every error the command line prints: it
redacts any URL it finds in the text, and any known secret value (the settings typed `Secret`, e.g. the
registry's headers and basic-auth password) wherever it appears, for code that forgot the first layer.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

from firehose_bq.source.kafka_security import JAAS_VALUE, jaas_value

MASK = "***"
# A URL inside free text: a scheme, then anything up to whitespace or a quote/bracket that ends it.
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{}]+")
# Punctuation that ends a sentence rather than a URL ("... from http://h/x: refused").
_TRAILING = ".,:;!?"
# The password of a Java JAAS line (Kafka's sasl.jaas.config): `password="..."`, '...' or bare.
_JAAS_PASSWORD = re.compile(r"\bpassword\s*=\s*" + JAAS_VALUE, re.S)
# Shorter fragments of a secret are not hunted for in text: they would mask ordinary words and numbers.
MIN_SECRET_CHARS = 4


def url(text: str) -> str:
    """`text` (a URL) fit for logs: user info → `***@`, every query value → `***`, a fragment → `***`."""
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError:  # not a URL after all (a bad port, an odd netloc): show only what cannot be secret
        return text.split("://", 1)[0] + "://" + MASK if "://" in text else text
    netloc = parts.netloc
    if parts.username is not None or parts.password is not None:
        netloc = f"{MASK}@{parts.hostname or ''}{f':{port}' if port else ''}"
    query = "&".join(f"{name}={MASK}" if sep else name
                     for name, sep, _ in (item.partition("=") for item in parts.query.split("&") if item))
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query, fragment=MASK if parts.fragment else ""))


def urls_in(text: str) -> str:
    """`text` with every URL in it passed through `url()`."""
    def one(match: re.Match[str]) -> str:
        found = match.group(0)
        core = found.rstrip(_TRAILING)
        return url(core) + found[len(core):]

    return _URL_IN_TEXT.sub(one, text)


def secret_fragments(value: str) -> list[str]:
    """The parts of a secret setting's value that may show up alone in a message.

    A header list `Name: Bearer tok, Other: v` yields each header's value and its credential after the
    auth scheme; `user:password` yields the password too; a JAAS line (`... password="p";`) yields its
    password, as written and unescaped.
    """
    fragments = {value}
    for password in _JAAS_PASSWORD.finditer(value):
        written = next(group for group in password.groups() if group is not None)
        fragments.update((written, jaas_value(password, 1)))
    for item in value.split(","):
        _, sep, header_value = item.partition(":")
        for part in (item, header_value if sep else ""):
            part = part.strip()
            fragments.add(part)
            fragments.add(part.rsplit(" ", 1)[-1])  # `Bearer <token>`: the token alone
    return sorted((f for f in fragments if len(f) >= MIN_SECRET_CHARS), key=len, reverse=True)


@dataclass(frozen=True)
class Redactor:
    """Masks URLs' credentials and the given secret values in any text."""

    secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, secret_values: Iterable[str]) -> Redactor:
        fragments = {f for value in secret_values if value for f in secret_fragments(value)}
        return cls(tuple(sorted(fragments, key=len, reverse=True)))  # longest first: no half-masked secret

    def text(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return urls_in(text)
