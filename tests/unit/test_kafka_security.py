"""Secured Kafka: Firehose's SOURCE_KAFKA_CONSUMER_CONFIG_* security settings reach every Kafka client of the
job, spelled for each library from one place; contradictions stop the start; credentials are never shown."""

from __future__ import annotations

import pickle
from pathlib import Path

from pyspark import cloudpickle
import pytest

from firehose_bq import config as config_module
from firehose_bq.config import Config
from firehose_bq.dlq import writers
from firehose_bq.errors import ConfigError
from firehose_bq.modes import handling_of
from firehose_bq.redact import Redactor
from firehose_bq.source.kafka_client import confluent_config
from firehose_bq.source.kafka_security import JaasError, KafkaSecurityConfig, parse_jaas
from firehose_bq.source.kafka_source import KafkaStreamReader
from tests.unit.test_config import MINIMAL
from tests.unit.test_cli import firehose
from tests.unit.test_source_isolation import planner_and_reader

PASSWORD = "kafka-pa$s-71c2"
SCRAM = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="svc" password="{PASSWORD}";'
PLAIN = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="svc" password="{PASSWORD}";'
SASL_SSL = {"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SASL_SSL",
            "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM": "SCRAM-SHA-512",
            "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG": SCRAM}
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def _problems(env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as failed:
        Config.from_env({**MINIMAL, **env})
    return failed.value.problems


@pytest.fixture
def ca_file(tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    path.write_text(CA_PEM)
    return str(path)


# --- JAAS ----------------------------------------------------------------------------------------------------


def test_jaas_scram_and_plain_lines_give_username_and_password() -> None:
    for line, module in ((SCRAM, "scram.ScramLoginModule"), (PLAIN, "plain.PlainLoginModule")):
        creds = parse_jaas(line)
        assert (creds.username, creds.password.reveal()) == ("svc", PASSWORD)
        assert creds.login_module.endswith(module)


def test_jaas_escaped_quotes_bare_values_spacing_and_other_options() -> None:
    creds = parse_jaas('  org.apache.kafka.common.security.plain.PlainLoginModule  REQUIRED\n'
                       '  username=bare_user   password = "a \\"quoted\\" p\\\\w;d"  tokenauth="false" ; ')
    assert creds.username == "bare_user"
    assert creds.password.reveal() == 'a "quoted" p\\w;d'


def test_jaas_single_quoted_values_as_kafka_and_confluent_cloud_write_them() -> None:
    # Kafka's JaasConfig takes ' as a quote too; Confluent Cloud's client settings are written that way.
    creds = parse_jaas("org.apache.kafka.common.security.plain.PlainLoginModule required username='ABCKEY' "
                       "password='x\\'y\"z;w';")
    assert (creds.username, creds.password.reveal()) == ("ABCKEY", "x'y\"z;w")


@pytest.mark.parametrize(("line", "says"), [
    ('org.apache.kafka.common.security.scram.ScramLoginModule required username="u";', "has no password"),
    (f'org.apache.kafka.common.security.scram.ScramLoginModule required password="{PASSWORD}";', "has no username"),
    ('org.apache.kafka.common.security.scram.ScramLoginModule required;', "has no username and no password"),
    (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="{PASSWORD}',
     "unterminated quote"),
    (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="{PASSWORD}"',
     "missing the `;`"),
    (f'username="u" password="{PASSWORD}";', "expected `<LoginModule class> required"),
    (f'com.sun.security.auth.module.Krb5LoginModule required username="u" password="{PASSWORD}";',
     "login module com.sun.security.auth.module.Krb5LoginModule is not supported"),
    ('org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;', "is not supported"),
    (f'{SCRAM} {SCRAM}', "one login module only"),
])
def test_an_unusable_jaas_line_is_refused_without_quoting_it(line: str, says: str) -> None:
    with pytest.raises(JaasError) as refused:
        parse_jaas(line)
    assert says in str(refused.value) and PASSWORD not in str(refused.value)


# --- the clients' spelling ---------------------------------------------------------------------------------------


def test_plaintext_adds_nothing_to_either_client() -> None:
    security = Config.from_env(MINIMAL).kafka_security
    assert security.librdkafka() == {} and security.kafka_python() == {}


def test_sasl_ssl_with_jaas_maps_to_librdkafka_and_kafka_python(ca_file: str) -> None:
    security = Config.from_env({**MINIMAL, **SASL_SSL,
                                "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_LOCATION": ca_file}).kafka_security
    assert security.librdkafka() == {"security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512",
                                     "sasl.username": "svc", "sasl.password": PASSWORD, "ssl.ca.location": ca_file}
    assert security.kafka_python() == {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                                       "sasl_plain_username": "svc", "sasl_plain_password": PASSWORD,
                                       "ssl_cafile": ca_file}


def test_sasl_plaintext_with_plain_username_and_password_settings() -> None:
    security = Config.from_env({**MINIMAL, "SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                                "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM": "PLAIN",
                                "SOURCE_KAFKA_SASL_USERNAME": "svc", "SOURCE_KAFKA_SASL_PASSWORD": PASSWORD}).kafka_security
    assert security.librdkafka() == {"security.protocol": "sasl_plaintext", "sasl.mechanisms": "PLAIN",
                                     "sasl.username": "svc", "sasl.password": PASSWORD}
    assert security.kafka_python() == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                                       "sasl_plain_username": "svc", "sasl_plain_password": PASSWORD}


def test_ssl_alone_uses_the_system_cas_when_no_ca_file_is_given() -> None:
    security = Config.from_env({**MINIMAL, "SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SSL"}).kafka_security
    assert security.librdkafka() == {"security.protocol": "ssl"}
    assert security.kafka_python() == {"security_protocol": "SSL"}


def test_librdkafka_accepts_every_property_the_mapping_makes(ca_file: str) -> None:
    # librdkafka checks names and values when the client is made (no connection yet): a misspelt property
    # would fail here, not on a production cluster.
    import confluent_kafka as ck

    security = Config.from_env({**MINIMAL, **SASL_SSL,
                                "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_LOCATION": ca_file}).kafka_security
    conf = confluent_config("127.0.0.1:1", 10, security=security)
    try:
        ck.Consumer(conf).close()
    except ck.KafkaException as exc:  # only the fake CA's content may be refused, never a property
        assert "ssl.ca.location" in str(exc) or "certificate" in str(exc).lower(), exc


def test_kafka_python_accepts_every_keyword_the_mapping_makes() -> None:
    from kafka import KafkaConsumer

    security = Config.from_env({**MINIMAL, **SASL_SSL}).kafka_security
    # An unknown keyword raises at once; a known one is only used on connecting (none here: no bootstrap).
    KafkaConsumer(bootstrap_servers="127.0.0.1:1", api_version=(2, 8), **security.kafka_python()).close()


# --- start checks -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "named", "says"), [
    ({"SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM": "PLAIN"}, "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM",
     "only used with SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL=SASL_PLAINTEXT or SASL_SSL"),
    ({"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SSL", "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG": SCRAM},
     "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG", "only used with"),
    ({"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SASL_SSL",
      "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM": "SCRAM-SHA-256"},
     "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG", "required with SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL"),
    ({"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
      "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG": SCRAM},
     "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM", "required with"),
    ({**SASL_SSL, "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM": "PLAIN"},
     "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG", "does not log in with"),
    ({**SASL_SSL, "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG": SCRAM.replace("scram.ScramLoginModule",
                                                                                   "plain.FooLoginModule")},
     "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG", "is not supported"),
    ({**SASL_SSL, "SOURCE_KAFKA_SASL_USERNAME": "svc", "SOURCE_KAFKA_SASL_PASSWORD": PASSWORD},
     "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG / SOURCE_KAFKA_SASL_USERNAME", "not both"),
    ({"SOURCE_KAFKA_SASL_PASSWORD": PASSWORD}, "SOURCE_KAFKA_SASL_PASSWORD", "only used with SOURCE_KAFKA_SASL_USERNAME"),
    ({"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SSL",
      "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_LOCATION": "/nonexistent/ca.pem"},
     "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_LOCATION", "cannot read /nonexistent/ca.pem"),
    ({"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "TLS"}, "SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL",
     "expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
])
def test_a_contradiction_stops_the_start_in_one_line_naming_the_variable(env: dict[str, str], named: str,
                                                                         says: str) -> None:
    problems = _problems(env)
    assert len(problems) == 1 and problems[0].startswith(f"{named}: ") and says in problems[0], problems
    assert PASSWORD not in problems[0]


def test_the_protocol_is_read_whatever_its_case_as_kafka_reads_security_protocol() -> None:
    # Kafka's SecurityProtocol.forName upper-cases the value: `sasl_ssl` in a Firehose env file works there.
    security = Config.from_env({**MINIMAL, **SASL_SSL,
                                "SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "sasl_ssl"}).kafka_security
    assert security.protocol == "SASL_SSL" and security.tls and security.sasl
    assert security.librdkafka()["security.protocol"] == "sasl_ssl"
    assert security.kafka_python()["security_protocol"] == "SASL_SSL"


def test_empty_security_settings_of_a_templated_env_file_are_the_plaintext_defaults() -> None:
    # A deployment template that renders every security variable, empty for a cluster without security.
    empty = {name: "" for name in ("SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM",
                                   "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG", "SOURCE_KAFKA_SASL_USERNAME",
                                   "SOURCE_KAFKA_SASL_PASSWORD", "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_LOCATION")}
    assert Config.from_env({**MINIMAL, **empty}).kafka_security == KafkaSecurityConfig()


def test_a_ca_file_that_is_not_pem_or_a_ca_without_tls_is_refused(tmp_path: Path, ca_file: str) -> None:
    jks = tmp_path / "truststore.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed\x00\x00\x00\x02")
    [problem] = _problems({"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SSL",
                           "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_LOCATION": str(jks)})
    assert problem.startswith("SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_LOCATION: ") and "keytool" in problem
    [problem] = _problems({"SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_LOCATION": ca_file})
    assert "only used with SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL=SSL or SASL_SSL" in problem


def test_firehose_security_variables_are_settings_not_typos() -> None:
    assert config_module.unknown_variables({**MINIMAL, **SASL_SSL}) == []


# --- Firehose's DLQ_KAFKA_* security variables ------------------------------------------------------------------

DLQ_ON = {"DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "KAFKA"}


def test_firehose_dlq_security_variables_saying_what_the_source_says_are_accepted(ca_file: str) -> None:
    # A Firehose env file gives its DLQ producer the same security again: it carries over, without warnings.
    single_quoted = SCRAM.replace('"', "'")
    same = {"DLQ_KAFKA_SECURITY_PROTOCOL": "sasl_ssl", "DLQ_KAFKA_SASL_MECHANISM": "scram-sha-512",
            "DLQ_KAFKA_SASL_JAAS_CONFIG": single_quoted, "DLQ_KAFKA_SSL_TRUSTSTORE_LOCATION": ca_file}
    env = {**MINIMAL, **SASL_SSL, "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_LOCATION": ca_file, **DLQ_ON, **same}
    Config.from_env(env)
    assert config_module.unknown_variables(env) == []
    plain = {"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
             "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM": "SCRAM-SHA-512",
             "SOURCE_KAFKA_SASL_USERNAME": "svc", "SOURCE_KAFKA_SASL_PASSWORD": PASSWORD}
    Config.from_env({**MINIMAL, **plain, **DLQ_ON, "DLQ_KAFKA_SASL_JAAS_CONFIG": SCRAM})  # same credentials
    Config.from_env({**MINIMAL, **DLQ_ON, "DLQ_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"})  # the source's default


@pytest.mark.parametrize(("dlq", "named"), [
    ({"DLQ_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, "DLQ_KAFKA_SECURITY_PROTOCOL"),
    ({"DLQ_KAFKA_SASL_MECHANISM": "PLAIN"}, "DLQ_KAFKA_SASL_MECHANISM"),
    ({"DLQ_KAFKA_SASL_JAAS_CONFIG": SCRAM.replace(PASSWORD, "other-pa$s-9e41")}, "DLQ_KAFKA_SASL_JAAS_CONFIG"),
    ({"DLQ_KAFKA_SASL_JAAS_CONFIG": "not a jaas line other-pa$s-9e41"}, "DLQ_KAFKA_SASL_JAAS_CONFIG"),
    ({"DLQ_KAFKA_SSL_TRUSTSTORE_LOCATION": "/etc/other-ca.pem"}, "DLQ_KAFKA_SSL_TRUSTSTORE_LOCATION"),
    ({"DLQ_KAFKA_SSL_KEY_PASSWORD": "other-pa$s-9e41"}, "DLQ_KAFKA_SSL_KEY_PASSWORD"),
])
def test_a_dlq_with_security_of_its_own_stops_the_start(dlq: dict[str, str], named: str) -> None:
    # Firehose would have produced dead letters with these; this job would use the source's and be refused by
    # the DLQ's brokers only at the first dead letter, minutes into the run.
    [problem] = _problems({**SASL_SSL, **DLQ_ON, **dlq})
    assert problem.startswith(f"{named}: differs from SOURCE_KAFKA_") and "not supported" in problem
    assert "9e41" not in problem and PASSWORD not in problem



def test_dlq_file_paths_naming_the_sources_files_are_the_same_setting(ca_file: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # `./ca.pem` beside `/etc/kafka/ca.pem` is one file: compared as text, it was called a DLQ security of its own.
    keystore = tmp_path / "client.pem"
    keystore.write_text(CA_PEM + "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n")
    (tmp_path / "link.pem").symlink_to(ca_file)
    monkeypatch.chdir(tmp_path)
    source = {"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SSL",
              "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_TRUSTSTORE_LOCATION": ca_file,
              "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_LOCATION": "client.pem"}
    for ca in ("./ca.pem", f"{tmp_path}/../{tmp_path.name}/ca.pem", "link.pem"):
        Config.from_env({**MINIMAL, **source, **DLQ_ON, "DLQ_KAFKA_SSL_TRUSTSTORE_LOCATION": ca,
                         "DLQ_KAFKA_SSL_KEYSTORE_LOCATION": str(keystore)})
    # another file, or a path to nothing, still differs
    (tmp_path / "other.pem").write_text(CA_PEM)
    for ca in ("other.pem", "missing/ca.pem"):
        [problem] = _problems({**source, **DLQ_ON, "DLQ_KAFKA_SSL_TRUSTSTORE_LOCATION": ca})
        assert problem.startswith("DLQ_KAFKA_SSL_TRUSTSTORE_LOCATION: differs from ")


@pytest.mark.parametrize(("source", "dlq"), [
    ({}, {"DLQ_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"}),
    ({}, {"DLQ_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT", "DLQ_KAFKA_SASL_MECHANISM": "PLAIN"}),
    ({}, {"DLQ_KAFKA_SECURITY_PROTOCOL": "plaintext", "DLQ_KAFKA_SASL_JAAS_CONFIG": SCRAM}),
    ({}, {"DLQ_KAFKA_SSL_TRUSTSTORE_LOCATION": "/etc/kafka/ca.pem", "DLQ_KAFKA_SSL_KEYSTORE_LOCATION": "/etc/k.pem",
          "DLQ_KAFKA_SSL_KEY_PASSWORD": "other-pa$s-9e41"}),
    ({"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
      "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_MECHANISM": "SCRAM-SHA-512", "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG": SCRAM},
     {"DLQ_KAFKA_SSL_TRUSTSTORE_LOCATION": "/etc/kafka/ca.pem"}),
])
def test_dlq_security_variables_their_protocol_does_not_use_are_warned_about_not_refused(
        source: dict[str, str], dlq: dict[str, str]) -> None:
    # Kafka (and so Firehose's DLQ producer) ignores SASL settings without SASL and TLS ones without TLS: an env
    # file carrying them worked, and this job connects with the source's settings anyway.
    env = {**MINIMAL, **source, **DLQ_ON, **dlq}
    config = Config.from_env(env)
    ignored = sorted(name for name in dlq if name != "DLQ_KAFKA_SECURITY_PROTOCOL")
    warnings = config.dlq_security_ignored(env)
    assert sorted(w.split(" ", 1)[0] for w in warnings) == ignored
    assert all("has no effect" in w and "9e41" not in w and PASSWORD not in w for w in warnings), warnings
    assert Config.from_env({**MINIMAL, **source}).dlq_security_ignored({**MINIMAL, **source, **dlq}) == []  # DLQ off

def test_dlq_security_variables_are_unused_without_a_kafka_dlq() -> None:
    other = {"DLQ_KAFKA_SECURITY_PROTOCOL": "SSL", "DLQ_KAFKA_SASL_JAAS_CONFIG": "x"}
    Config.from_env({**MINIMAL, **other})
    Config.from_env({**MINIMAL, **other, "DLQ_SINK_ENABLE": "true", "DLQ_WRITER_TYPE": "LOG"})


def test_the_dlq_jaas_line_and_key_password_are_masked_as_the_sources_are() -> None:
    secret = config_module.secret_settings()
    assert "DLQ_KAFKA_SASL_JAAS_CONFIG" in secret and "DLQ_KAFKA_SSL_KEY_PASSWORD" in secret


# --- secrets -----------------------------------------------------------------------------------------------------


def test_the_jaas_line_and_password_are_secret_settings_and_masked() -> None:
    secret = config_module.secret_settings()
    assert "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG" in secret and "SOURCE_KAFKA_SASL_PASSWORD" in secret
    escaped = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="svc" password="a\\"b-9f3e";'
    redactor = Redactor.of([SCRAM, escaped])
    masked = redactor.text(f"auth failed with {PASSWORD}; then a\"b-9f3e; then a\\\"b-9f3e for svc")
    assert PASSWORD not in masked and "b-9f3e" not in masked
    assert "svc" in masked  # a user name is no secret: short common words must not vanish from every line


def test_a_single_quoted_or_bare_jaas_password_is_masked_alone_too() -> None:
    for written, password in (("'q7\\'pw-51ad'", "q7'pw-51ad"), ("q7pw-51ad", "q7pw-51ad")):
        line = f"org.apache.kafka.common.security.plain.PlainLoginModule required username=svc password={written};"
        assert parse_jaas(line).password.reveal() == password
        masked = Redactor.of([line]).text(f"auth failed with {password} for svc")
        assert "pw-51ad" not in masked and "svc" in masked


def test_config_check_and_the_job_settings_never_show_the_password() -> None:
    cfg = Config.from_env({**MINIMAL, **SASL_SSL})
    assert PASSWORD in cfg.secret_values()[0] and PASSWORD not in repr(cfg) and PASSWORD not in str(cfg.public_dict())
    done = firehose("config", "check", env={**MINIMAL, **SASL_SSL})
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout + done.stderr and "SASL_SSL" in done.stdout


def test_a_rejected_jaas_line_is_not_echoed_by_the_command_line() -> None:
    done = firehose("config", "check", env={**MINIMAL, **SASL_SSL,
                                            "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG": SCRAM.rstrip(";")})
    assert done.returncode == 2
    assert "SOURCE_KAFKA_CONSUMER_CONFIG_SASL_JAAS_CONFIG: missing the `;`" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr


# --- every client, the tasks included -------------------------------------------------------------------------------


def test_the_job_hands_its_security_to_the_planner_and_the_tasks_reader() -> None:
    config = Config.from_env({**MINIMAL, **SASL_SSL})
    planner, reader = planner_and_reader(config)
    for shipped in (planner, reader):
        assert shipped.security.librdkafka() == config.kafka_security.librdkafka()
        assert shipped.security.kafka_python() == config.kafka_security.kafka_python()
        assert PASSWORD not in repr(shipped)
    # Each is shipped pickled: the planner to its workers for read(), the reader (Spark pickles the batch
    # function with cloudpickle) to the tasks.
    for dumps in (pickle.dumps, cloudpickle.dumps):
        for shipped in (planner, reader):
            assert pickle.loads(dumps(shipped)).security.librdkafka() == config.kafka_security.librdkafka()
    # The password's option name is one Spark's redaction (spark.redaction.regex) masks where options show.
    assert [k for k, v in config.kafka_security.to_options().items() if v == PASSWORD] == ["sasl_password"]


def test_plaintext_planner_options_keep_the_defaults() -> None:
    planner = KafkaStreamReader({"brokers": "b:1", "topics": "t", "group_id": "g"})
    assert planner.security == KafkaSecurityConfig()


def test_the_dlq_and_fallback_producers_use_the_source_security(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, object]] = []

    class Producer:
        def __init__(self, **kwargs: object) -> None:
            made.append(kwargs)

    import kafka
    monkeypatch.setattr(kafka, "KafkaProducer", Producer)
    cfg = Config.from_env({**MINIMAL, **SASL_SSL, "DLQ_SINK_ENABLE": "true",
                           "SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC": "unrouted"})
    handling = handling_of(cfg)
    assert handling.fallback is not None
    for dlq in (handling.dlq, handling.fallback):
        writers.KafkaDlqWriter(dlq)
    assert len(made) == 2
    for kwargs in made:
        assert kwargs["security_protocol"] == "SASL_SSL" and kwargs["sasl_plain_password"] == PASSWORD
        assert kwargs["bootstrap_servers"] == "k:9092"
    assert PASSWORD not in repr(handling)


def test_the_replay_consumer_uses_the_source_security(monkeypatch: pytest.MonkeyPatch) -> None:
    from firehose_bq.dlq import replay

    made: list[dict[str, object]] = []

    class Consumer:
        def __init__(self, **kwargs: object) -> None:
            made.append(kwargs)

        def partitions_for_topic(self, topic: str) -> set[int]:
            return set()

        def close(self) -> None:
            pass

    import kafka
    monkeypatch.setattr(kafka, "KafkaConsumer", Consumer)
    security = Config.from_env({**MINIMAL, **SASL_SSL}).kafka_security
    with pytest.raises(Exception, match="does not exist"):
        replay.KafkaDlqSource("b:1", "dlq", "g", None, security=security)
    assert made[0]["sasl_mechanism"] == "SCRAM-SHA-512" and made[0]["sasl_plain_username"] == "svc"



def test_sample_produce_uses_the_source_security(monkeypatch: pytest.MonkeyPatch) -> None:
    from firehose_bq import cli, sample

    made: list[tuple[str, dict[str, object]]] = []

    class Client:
        def __init__(self, **kwargs: object) -> None:
            made.append((type(self).__name__, kwargs))

        def create_topics(self, topics: object) -> None:
            pass

        def send(self, *args: object, **kwargs: object) -> object:
            raise RuntimeError("sent")  # one attempt is enough: the kwargs are what the test reads

        def close(self, *args: object, **kwargs: object) -> None:
            pass

    class Admin(Client):
        pass

    class Producer(Client):
        pass

    monkeypatch.setattr(sample, "KafkaAdminClient", Admin)
    monkeypatch.setattr(sample, "KafkaProducer", Producer)
    example = Path(__file__).resolve().parents[2] / "descriptors" / "example.desc"
    for name, value in {**MINIMAL, **SASL_SSL, "SCHEMA_REGISTRY_STENCIL_URLS": str(example),
                        "INPUT_SCHEMA_PROTO_CLASS": "firehose.example.v1.Booking"}.items():
        monkeypatch.setenv(name, value)
    cli.main(["sample", "produce", "--count", "1"])
    assert [kind for kind, _ in made] == ["Admin", "Producer"]
    for _, kwargs in made:
        assert kwargs["security_protocol"] == "SASL_SSL" and kwargs["sasl_plain_password"] == PASSWORD


# --- client certificates (mutual TLS) -----------------------------------------------------------------------------

KEY_PASSWORD = "key-pw-2e81"


@pytest.fixture(scope="module")
def keystore(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pem_keystore(tmp_path_factory.mktemp("tls"))


def pem_keystore(where: Path) -> str:
    """A real PEM keystore: a self-signed certificate and its encrypted private key, in one file."""
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-days", "1", "-subj", "/CN=client",
                    "-keyout", str(where / "key.pem"), "-out", str(where / "cert.pem"),
                    "-passout", f"pass:{KEY_PASSWORD}"], check=True, capture_output=True)
    path = where / "client.pem"
    path.write_bytes((where / "cert.pem").read_bytes() + (where / "key.pem").read_bytes())
    return str(path)


def test_a_pem_keystore_maps_to_both_libraries_and_both_load_it(keystore: str) -> None:
    import ssl

    import confluent_kafka as ck

    security = Config.from_env({**MINIMAL, "SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SSL",
                                "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_LOCATION": keystore,
                                "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEY_PASSWORD": KEY_PASSWORD}).kafka_security
    assert security.librdkafka() == {"security.protocol": "ssl", "ssl.certificate.location": keystore,
                                     "ssl.key.location": keystore, "ssl.key.password": KEY_PASSWORD}
    kwargs = security.kafka_python()
    assert kwargs == {"security_protocol": "SSL", "ssl_certfile": keystore, "ssl_keyfile": keystore,
                      "ssl_password": KEY_PASSWORD}
    # librdkafka loads certificate and key when the client is made: a wrong password or file fails here.
    ck.Consumer(confluent_config("127.0.0.1:1", 10, security=security)).close()
    with pytest.raises(ck.KafkaException):
        ck.Consumer({**confluent_config("127.0.0.1:1", 10, security=security), "ssl.key.password": "wrong"})
    # kafka-python hands these to the ssl module's load_cert_chain when it connects.
    ssl.create_default_context().load_cert_chain(kwargs["ssl_certfile"], kwargs["ssl_keyfile"], kwargs["ssl_password"])
    assert "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEY_PASSWORD" in config_module.secret_settings()
    assert KEY_PASSWORD not in repr(security)


def test_the_planner_gets_the_keystore_and_its_password_from_the_options(keystore: str) -> None:
    config = Config.from_env({**MINIMAL, "SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SSL",
                              "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_LOCATION": keystore,
                              "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEY_PASSWORD": KEY_PASSWORD})
    planner, reader = planner_and_reader(config)
    assert planner.security.librdkafka() == reader.security.librdkafka() == config.kafka_security.librdkafka()
    assert [k for k, v in config.kafka_security.to_options().items() if v == KEY_PASSWORD] == ["ssl_key_password"]


def test_keystore_contradictions_stop_the_start(tmp_path: Path, ca_file: str, keystore: str) -> None:
    ssl_on = {"SOURCE_KAFKA_CONSUMER_CONFIG_SECURITY_PROTOCOL": "SSL"}
    [problem] = _problems({**ssl_on, "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_LOCATION": ca_file})  # no key
    assert problem.startswith("SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_LOCATION: ") and "no PEM private key" in problem
    [problem] = _problems({**ssl_on, "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEY_PASSWORD": KEY_PASSWORD})
    assert problem.startswith("SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEY_PASSWORD: only used with") and KEY_PASSWORD not in problem
    [problem] = _problems({"SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_LOCATION": keystore})
    assert problem.startswith("SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_LOCATION: only used with")
    [problem] = _problems({**ssl_on, "SOURCE_KAFKA_CONSUMER_CONFIG_SSL_KEYSTORE_LOCATION": str(tmp_path / "none.pem")})
    assert "cannot read" in problem
