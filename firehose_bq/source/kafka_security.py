"""How every Kafka client of the job reaches a secured cluster: SSL and SASL settings, one mapping per library.

The settings keep Firehose's names (SOURCE_KAFKA_CONSUMER_CONFIG_*: its env files carry over), and its
Java form of the credentials: a JAAS line such as
`org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";`. Every
client the job makes (the driver's metadata client, both range readers, the DLQ and route-fallback
producer, the replay consumer) takes its security options from `librdkafka()` or `kafka_python()`: the
same brokers, the same credentials, one place that spells them for each library.

The object is pickled to the Spark tasks with the reader, and travels to the source's planning process
as data source options (`to_options` / `from_options`): the password under an option name that Spark's
redaction pattern (`spark.redaction.regex`: secret|password|token) matches, so the query's plan shows it
masked (tests/integration/test_kafka_security.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from firehose_bq.settings import Secret, setting

PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL = "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"
PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
PLAIN, SCRAM_256, SCRAM_512 = "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"
MECHANISMS = (PLAIN, SCRAM_256, SCRAM_512)
# The login module a mechanism's JAAS line names (Kafka refuses a PLAIN client logging in with SCRAM's).
LOGIN_MODULES = {PLAIN: "org.apache.kafka.common.security.plain.PlainLoginModule",
                 SCRAM_256: "org.apache.kafka.common.security.scram.ScramLoginModule",
                 SCRAM_512: "org.apache.kafka.common.security.scram.ScramLoginModule"}

# Each library's name for: the protocol, the mechanism, the username, the password, the CA file, the client's
# certificate, its key (both from the one PEM keystore file) and the key's password.
LIBRDKAFKA_NAMES = ("security.protocol", "sasl.mechanisms", "sasl.username", "sasl.password", "ssl.ca.location",
                    "ssl.certificate.location", "ssl.key.location", "ssl.key.password")
KAFKA_PYTHON_NAMES = ("security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password", "ssl_cafile",
                      "ssl_certfile", "ssl_keyfile", "ssl_password")

PROTOCOL_ENV = "SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL"
MECHANISM_ENV = "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM"
JAAS_ENV = "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG"
USERNAME_ENV = "SOURCE_KAFKA_SASL_USERNAME"
PASSWORD_ENV = "SOURCE_KAFKA_SASL_PASSWORD"
CA_ENV = "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_LOCATION"
KEYSTORE_ENV = "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_LOCATION"
KEY_PASSWORD_ENV = "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEY_PASSWORD"

# Firehose's DLQ producer takes security settings of its own (any DLQ_KAFKA_* property), and its env files
# carry them: this job's DLQ producer and `replay-dlq` use the source's, so each must say the same.
DLQ_PROTOCOL_ENV = "DLQ_KAFKA_SECURITY_PROTOCOL"
DLQ_SECURITY_ENVS = {DLQ_PROTOCOL_ENV: PROTOCOL_ENV, "DLQ_KAFKA_SASL_MECHANISM": MECHANISM_ENV,
                     "DLQ_KAFKA_SASL_JAAS_CONFIG": JAAS_ENV, "DLQ_KAFKA_SSL_TRUSTSTORE_LOCATION": CA_ENV,
                     "DLQ_KAFKA_SSL_KEYSTORE_LOCATION": KEYSTORE_ENV, "DLQ_KAFKA_SSL_KEY_PASSWORD": KEY_PASSWORD_ENV}
# The ones Kafka reads only with SASL, only with TLS (the protocol decides: the others are ignored).
_DLQ_SASL_ONLY = ("DLQ_KAFKA_SASL_MECHANISM", "DLQ_KAFKA_SASL_JAAS_CONFIG")
_DLQ_TLS_ONLY = ("DLQ_KAFKA_SSL_TRUSTSTORE_LOCATION", "DLQ_KAFKA_SSL_KEYSTORE_LOCATION", "DLQ_KAFKA_SSL_KEY_PASSWORD")

# Firehose's Java key and trust store settings, which a Firehose env file for a TLS cluster carries: this job
# takes PEM files instead. Named as unread rather than as typos ("did you mean ..._SSL_KEY_PASSWORD?" would
# point at another secret).
_JAVA_STORE = ("Firehose's Java key or trust store setting, not read: this job takes PEM files "
               f"({CA_ENV}, {KEYSTORE_ENV}; Secured Kafka in README.md)")
JAVA_STORE_SETTINGS = ("SSL_TRUSTSTORE_PASSWORD", "SSL_KEYSTORE_PASSWORD", "SSL_TRUSTSTORE_TYPE", "SSL_KEYSTORE_TYPE")


def java_store_variables(prefix: str, why: str) -> dict[str, str]:
    """Firehose's Java key and trust store variables under `prefix` (the source's, the DLQ producer's), each
    with `why` this job does not read it."""
    return {prefix + name: why for name in JAVA_STORE_SETTINGS}


FIREHOSE_UNREAD = java_store_variables("SOURCE_KAFKA_CONSUMER_CONFIG_", _JAVA_STORE)

# `<module> <flag> key=value ... ;`: Java's JAAS grammar, as Kafka's `sasl.jaas.config` takes one entry.
_JAAS_HEAD = re.compile(r"\s*([A-Za-z_$][\w$.]*)\s+(required|requisite|sufficient|optional)\b", re.I)
# A value: quoted with " or ' (Kafka's JaasConfig takes both; Confluent Cloud's client settings use '), `\`
# escaping the next character, or bare.
JAAS_VALUE = r"""(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|([^\s;"']+))"""
_JAAS_OPTION = re.compile(r"\s*([\w.-]+)\s*=\s*" + JAAS_VALUE, re.S)
_PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PEM_KEY = re.compile(rb"-----BEGIN (?:RSA |EC |ENCRYPTED )?PRIVATE KEY-----")
_EXPORT_HINT = {CA_ENV: "Export its CA to PEM: keytool -exportcert -rfc -alias <ca> -keystore <truststore> -file ca.pem",
                KEYSTORE_ENV: "Convert it: openssl pkcs12 -in <keystore.p12> -out client.pem (certificate and key)"}


class JaasError(ValueError):
    """A JAAS line this job cannot use; its message never quotes the line (it holds a password)."""


def jaas_value(match: re.Match[str], first: int) -> str:
    """The value JAAS_VALUE matched from group `first` on: unquoted, escapes undone."""
    double, single, bare = match.group(first, first + 1, first + 2)
    quoted = double if double is not None else single
    return re.sub(r"\\(.)", r"\1", quoted, flags=re.S) if quoted is not None else bare


def dlq_security_problems(environ: Mapping[str, str], source: KafkaSecurityConfig, dlq_kafka: bool) -> list[str]:
    """Firehose's DLQ_KAFKA_* security variables that say otherwise than the source's settings (`source`):
    this job reaches the DLQ topic with those (`dlq_kafka`: the DLQ is on and written to Kafka; otherwise the
    variables are unused). Compared as Kafka reads them: names without case, a JAAS line by its credentials,
    file paths by the file they name; a variable the DLQ's protocol does not use is not compared
    (`dlq_security_ignored`)."""
    if not dlq_kafka:
        return []
    problems = []
    ignored = _ignored_by_protocol(environ, source)
    for dlq_env, source_env in DLQ_SECURITY_ENVS.items():
        given = environ.get(dlq_env, "").strip()
        if given and dlq_env not in ignored and not source.says(source_env, given):
            # The values are not quoted: three of them are secrets.
            problems.append(f"{dlq_env}: differs from {source_env}, and the DLQ producer and `replay-dlq` connect "
                            f"with the source's Kafka security settings (a DLQ with security of its own is not "
                            f"supported): unset {dlq_env}, or give it the source's value")
    return problems


def dlq_security_ignored(environ: Mapping[str, str], source: KafkaSecurityConfig, dlq_kafka: bool) -> list[str]:
    """Warnings for Firehose's DLQ_KAFKA_* security variables that the DLQ's protocol does not use: Kafka, and
    so Firehose's DLQ producer, ignores SASL settings without SASL and TLS ones without TLS. An env file that
    carries them worked with Firehose; here they are not compared with the source's either."""
    if not dlq_kafka:
        return []
    protocol = _dlq_protocol(environ, source)
    given = (f"{DLQ_PROTOCOL_ENV} is {protocol}" if environ.get(DLQ_PROTOCOL_ENV, "").strip()
             else f"{DLQ_PROTOCOL_ENV} is unset and the source's is {protocol}")
    return [f"{env} is set but has no effect: {given}, which uses no {'SASL' if env in _DLQ_SASL_ONLY else 'TLS'} "
            f"(the DLQ producer and `replay-dlq` connect with the source's Kafka security settings); unset it"
            for env in _ignored_by_protocol(environ, source)]


def _dlq_protocol(environ: Mapping[str, str], source: KafkaSecurityConfig) -> str:
    """The DLQ producer's protocol as the variables give it: its own, else the source's (which it uses)."""
    return environ.get(DLQ_PROTOCOL_ENV, "").strip().upper() or source.protocol


def _ignored_by_protocol(environ: Mapping[str, str], source: KafkaSecurityConfig) -> list[str]:
    protocol = _dlq_protocol(environ, source)
    unused = (() if protocol in (SASL_PLAINTEXT, SASL_SSL) else _DLQ_SASL_ONLY) + \
             (() if protocol in (SSL, SASL_SSL) else _DLQ_TLS_ONLY)
    return [env for env in unused if environ.get(env, "").strip()]


def same_file(a: str, b: str) -> bool:
    """Whether paths `a` and `b` name one file (`./ca.pem` and `/etc/kafka/ca.pem` from /etc/kafka): as files
    when both exist, as text otherwise."""
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one is missing (or unreadable): only the text can say
        return False


@dataclass(frozen=True)
class Credentials:
    login_module: str
    username: str
    password: Secret


def parse_jaas(text: str) -> Credentials:
    """Username and password of a Kafka PlainLoginModule or ScramLoginModule JAAS line."""
    head = _JAAS_HEAD.match(text)
    if head is None:
        raise JaasError("expected `<LoginModule class> required username=\"...\" password=\"...\";`")
    module = head.group(1)
    if module not in set(LOGIN_MODULES.values()):
        raise JaasError(f"login module {module} is not supported: only {LOGIN_MODULES[PLAIN]} and "
                        f"{LOGIN_MODULES[SCRAM_512]} (username and password)")
    options: dict[str, str] = {}
    rest = text[head.end():]
    while not rest.strip().startswith(";"):
        option = _JAAS_OPTION.match(rest)
        if option is None:
            raise JaasError("expected key=\"value\" options ended by `;` after the login module (an unterminated "
                            "quote, or no `;` at the end?)" if rest.strip() else "missing the `;` that ends the line")
        options[option.group(1)] = jaas_value(option, 2)
        rest = rest[option.end():]
    if rest.strip() != ";":
        raise JaasError("one login module only: text after the `;` that ends it")
    missing = [name for name in ("username", "password") if not options.get(name)]
    if missing:
        raise JaasError(f"{module} has no {' and no '.join(missing)}")
    return Credentials(module, options["username"], Secret(options["password"]))


@dataclass(frozen=True)
class KafkaSecurityConfig:
    """Security of the connections to SOURCE_KAFKA_BROKERS, used by every Kafka client of the job."""

    protocol: str = setting(
        PROTOCOL_ENV,
        "How every Kafka client of the job connects (the source's readers, the DLQ and route-fallback producer, "
        "`replay-dlq`): TLS and/or SASL authentication, as Kafka's `security.protocol`. See Secured Kafka.",
        PLAINTEXT,
        choices=PROTOCOLS,
    )
    sasl_mechanism: str = setting(
        MECHANISM_ENV,
        "SASL mechanism (Kafka's `sasl.mechanism`); required with a SASL_* protocol (Kerberos/GSSAPI and OAUTHBEARER "
        "are not supported).",
        "",
        choices=MECHANISMS,
    )
    jaas_config: Secret | None = setting(
        JAAS_ENV,
        "SASL credentials in Firehose's (Java) form: `org.apache.kafka.common.security.scram.ScramLoginModule "
        "required username=\"u\" password=\"p\";` (or PlainLoginModule for PLAIN); only username and password "
        "are read. Or set SOURCE_KAFKA_SASL_USERNAME and SOURCE_KAFKA_SASL_PASSWORD instead (not both). "
        "Secret: never logged.",
        None,
    )
    sasl_username: str = setting(
        USERNAME_ENV, "SASL username, instead of SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG.", "",
    )
    sasl_password: Secret | None = setting(
        PASSWORD_ENV, "SASL password, with SOURCE_KAFKA_SASL_USERNAME. Secret: never logged.", None,
    )
    ssl_ca_location: str = setting(
        CA_ENV,
        "With SSL or SASL_SSL: PEM file of the CA certificate(s) that signed the brokers' certificates (Kafka's "
        "`ssl.truststore.type=PEM`); unset = the system's CAs. A Java JKS/PKCS12 truststore is refused: export it "
        "to PEM (`keytool -exportcert -rfc`). Broker host names are verified either way.",
        "",
    )
    ssl_keystore_location: str = setting(
        KEYSTORE_ENV,
        "With SSL or SASL_SSL, for brokers that authenticate clients by certificate (mutual TLS): PEM file holding "
        "the client's certificate (chain) and its private key (Kafka's `ssl.keystore.type=PEM`); a JKS/PKCS12 "
        "keystore is refused.",
        "",
    )
    ssl_key_password: Secret | None = setting(
        KEY_PASSWORD_ENV,
        "Password of an encrypted private key in SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_LOCATION. Secret: never "
        "logged.",
        None,
    )

    def says(self, env: str, value: str) -> bool:
        """Whether `value`, given for the setting named `env`, means what this config has for it."""
        if env == PROTOCOL_ENV:
            return value.upper() == self.protocol
        if env == MECHANISM_ENV:
            return value.upper() == self.sasl_mechanism.upper()
        if env == JAAS_ENV:
            try:
                given, ours = parse_jaas(value), self.credentials()
            except JaasError:
                return False
            return ours is not None and (given.username, given.password.reveal()) == (ours.username, ours.password.reveal())
        if env == KEY_PASSWORD_ENV:
            return self.ssl_key_password is not None and value == self.ssl_key_password.reveal()
        return same_file(value, {CA_ENV: self.ssl_ca_location, KEYSTORE_ENV: self.ssl_keystore_location}[env])

    @property
    def sasl(self) -> bool:
        return self.protocol in (SASL_PLAINTEXT, SASL_SSL)

    @property
    def tls(self) -> bool:
        return self.protocol in (SSL, SASL_SSL)

    def credentials(self) -> Credentials | None:
        """The SASL username and password, from the JAAS line or the plain settings (JaasError if unusable)."""
        if self.jaas_config is not None:
            return parse_jaas(self.jaas_config.reveal())
        if self.sasl_username and self.sasl_password is not None:
            return Credentials(LOGIN_MODULES.get(self.sasl_mechanism, ""), self.sasl_username, self.sasl_password)
        return None

    def problems(self) -> list[str]:
        """Contradictions that would otherwise surface as a broker's refusal (or a hang) at the first connection."""
        problems = []
        given = [JAAS_ENV] * (self.jaas_config is not None) + [USERNAME_ENV] * bool(self.sasl_username)
        if self.sasl_password is not None and not self.sasl_username:
            problems.append(f"{PASSWORD_ENV}: only used with {USERNAME_ENV}; set that too or unset this")
        if self.sasl_username and self.sasl_password is None:
            problems.append(f"{USERNAME_ENV}: needs {PASSWORD_ENV} too")
        if len(given) > 1:
            problems.append(f"{JAAS_ENV} / {USERNAME_ENV}: set one way of giving the SASL credentials, not both")
        if not self.sasl:
            problems.extend(f"{env}: only used with {PROTOCOL_ENV}=SASL_PLAINTEXT or SASL_SSL (it is {self.protocol})"
                            for env, value in ((MECHANISM_ENV, self.sasl_mechanism), (JAAS_ENV, self.jaas_config),
                                               (USERNAME_ENV, self.sasl_username)) if value)
        else:
            if not self.sasl_mechanism:
                problems.append(f"{MECHANISM_ENV}: required with {PROTOCOL_ENV}={self.protocol}: one of "
                                f"{', '.join(MECHANISMS)}")
            if not given:
                problems.append(f"{JAAS_ENV}: required with {PROTOCOL_ENV}={self.protocol} (or {USERNAME_ENV} and "
                                f"{PASSWORD_ENV})")
            problems.extend(self._jaas_problems())
        problems.extend(self._pem_problems(CA_ENV, self.ssl_ca_location, _PEM_CERTIFICATE))
        problems.extend(self._pem_problems(KEYSTORE_ENV, self.ssl_keystore_location, _PEM_CERTIFICATE, _PEM_KEY))
        if self.ssl_key_password is not None and not self.ssl_keystore_location:
            problems.append(f"{KEY_PASSWORD_ENV}: only used with {KEYSTORE_ENV}; set that too or unset this")
        return problems

    def _jaas_problems(self) -> list[str]:
        if self.jaas_config is None:
            return []
        try:
            module = parse_jaas(self.jaas_config.reveal()).login_module
        except JaasError as exc:
            return [f"{JAAS_ENV}: {exc}"]
        wanted = LOGIN_MODULES.get(self.sasl_mechanism)
        if wanted and module != wanted:
            return [f"{JAAS_ENV}: {module} does not log in with {MECHANISM_ENV}={self.sasl_mechanism}: use {wanted}"]
        return []

    def _pem_problems(self, env: str, path: str, *wanted: bytes | re.Pattern[bytes]) -> list[str]:
        """A PEM file setting: only with TLS, readable, holding what `wanted` names (a Java store is not PEM)."""
        if not path:
            return []
        if not self.tls:
            return [f"{env}: only used with {PROTOCOL_ENV}=SSL or SASL_SSL (it is {self.protocol})"]
        try:
            with open(path, "rb") as f:
                head = f.read(1 << 20)
        except OSError as exc:
            return [f"{env}: cannot read {path}: {exc.strerror or exc}"]
        for pem in wanted:
            if not (pem.search(head) if isinstance(pem, re.Pattern) else pem in head):
                what = "PEM certificate" if pem == _PEM_CERTIFICATE else "PEM private key"
                return [f"{env}: {path} holds no {what}: a Java JKS or PKCS12 store? {_EXPORT_HINT[env]}"]
        return []

    # --- the clients' spelling -------------------------------------------------------------------------------

    def librdkafka(self) -> dict[str, Any]:
        """confluent-kafka (librdkafka) properties; none for PLAINTEXT (its defaults)."""
        return self._spelled(LIBRDKAFKA_NAMES, self.protocol.lower())

    def kafka_python(self) -> dict[str, Any]:
        """kafka-python keyword arguments; none for PLAINTEXT (its defaults)."""
        return self._spelled(KAFKA_PYTHON_NAMES, self.protocol)

    def _spelled(self, names: tuple[str, ...], protocol: str) -> dict[str, Any]:
        values: list[Any] = [protocol if self.protocol != PLAINTEXT else None] + [None] * 7
        if self.sasl and (creds := self.credentials()) is not None:
            values[1:4] = self.sasl_mechanism, creds.username, creds.password.reveal()
        if self.tls:
            key_password = self.ssl_key_password.reveal() if self.ssl_key_password is not None else None
            values[4:8] = (self.ssl_ca_location or None, self.ssl_keystore_location or None,
                           self.ssl_keystore_location or None, key_password)
        return {name: value for name, value in zip(names, values, strict=True) if value is not None}

    # --- to the source's planning process ----------------------------------------------------------------------

    def to_options(self) -> dict[str, str]:
        """Data source options carrying these settings (credentials resolved; the JAAS line stays here)."""
        options = {"security_protocol": self.protocol, "sasl_mechanism": self.sasl_mechanism,
                   "ssl_ca_location": self.ssl_ca_location, "ssl_keystore_location": self.ssl_keystore_location}
        if self.ssl_key_password is not None:
            options["ssl_key_password"] = self.ssl_key_password.reveal()
        if self.sasl and (creds := self.credentials()) is not None:
            options.update({"sasl_username": creds.username, "sasl_password": creds.password.reveal()})
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaSecurityConfig:
        password, key_password = options.get("sasl_password"), options.get("ssl_key_password")
        return cls(protocol=options.get("security_protocol") or PLAINTEXT,
                   sasl_mechanism=options.get("sasl_mechanism", ""),
                   sasl_username=options.get("sasl_username", ""),
                   sasl_password=Secret(password) if password else None,
                   ssl_ca_location=options.get("ssl_ca_location", ""),
                   ssl_keystore_location=options.get("ssl_keystore_location", ""),
                   ssl_key_password=Secret(key_password) if key_password else None)
