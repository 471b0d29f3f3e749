# Every target sets up what it needs: the project venv (once per pyproject.toml change), the
# compiled descriptors, and (through `firehose-bq stack up`) the broker and emulator venvs.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
FH := $(VENV)/bin/firehose-bq
STAMP := $(VENV)/.installed
NATIVE := $(VENV)/.native
PROTOS := $(shell find proto -name '*.proto' | sort)
DESCRIPTORS := descriptors/example.desc
N ?= 10000
LOCAL := --env-file config/local.env --stack

.PHONY: help venv descriptors jvm-archive run test test-unit test-integration native-check lint bench up down status clean readme

help:
	@echo "make run     local broker + BigQuery emulator + $(N) sample messages → Spark job → summary"
	@echo "make test    unit + integration tests (starts its own stack on free ports)"
	@echo "make bench   benchmarks (ratios measured side by side)"
	@echo "make native-check   the native decoders' tests under AddressSanitizer/UBSan/LeakSanitizer"
	@echo "make jvm-archive   the driver JVM's class-data archive: each JVM starts ≈ 3 s faster (test and bench build it first)"
	@echo "make up | down | status   the local stack"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (found " + sys.version.split()[0] + ")")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

# The native decoders (setup.py): rebuilt in place when a C source changes (an editable install does not
# notice). Without a C compiler the build only warns, and the job decodes with the Python reference decoders.
$(NATIVE): $(wildcard firehose_bq/decode/*.c) setup.py $(STAMP)
	$(PY) setup.py -q build_ext --inplace
	@touch $@

venv: $(STAMP) $(NATIVE)
	@$(FH) doctor

descriptors: $(DESCRIPTORS)

# The driver JVM's class-data archive (firehose_bq/jvm_archive.py), once per venv (≈ 35 s): every JVM a job, a
# test or a benchmark starts afterwards maps Spark's classes from it instead of reading its jars, ≈ 3 s faster.
# `make test` (dozens of JVMs) and `make bench` (the job as deployed) build it first; `make run`, which a new
# user runs once, does not: `make jvm-archive` adds it.
jvm-archive: venv
	@$(FH) jvm-archive || echo "(no JVM class archive: every JVM starts as before, ≈ 3 s slower)"

$(DESCRIPTORS): $(PROTOS) $(STAMP)
	$(PY) -m grpc_tools.protoc --include_imports --include_source_info -Iproto \
		--descriptor_set_out=$@ $(PROTOS)

run: venv descriptors
	$(FH) stack up
	$(FH) sample produce $(LOCAL) --count $(N)
	$(FH) run $(LOCAL) --available-now
	$(FH) table preview $(LOCAL) --rows 3
	@echo "The stack keeps running for exploration; 'make down' stops it."

test: venv descriptors jvm-archive
	$(PY) -m pytest tests

# Pyflakes' checks only (unused imports, undefined names): the layout is the authors', not a formatter's.
lint: $(STAMP)
	$(VENV)/bin/ruff check --select F firehose_bq tests bench

test-unit: venv descriptors
	$(PY) -m pytest tests/unit

test-integration: venv descriptors jvm-archive
	$(PY) -m pytest tests/integration

# The native decoders' tests (protobuf and JSON) with the extensions built under AddressSanitizer, UndefinedBehaviorSanitizer
# and LeakSanitizer (leaks counted only where the extensions allocated), then the normal build back.
SANITIZE := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
native-check: venv descriptors
	rm -rf .native-check && mkdir -p .native-check
	CFLAGS="$(SANITIZE)" LDFLAGS="-fsanitize=address,undefined" $(PY) setup.py -q build_ext --inplace --force
	status=0; LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=1:log_path=.native-check/asan LSAN_OPTIONS=exitcode=0 \
		$(PY) -m pytest tests/unit/decode -q -p no:cacheprovider || status=$$?; \
	$(PY) setup.py -q build_ext --inplace --force; touch $(NATIVE); \
	$(PY) tests/sanitizer_logs.py .native-check && exit $$status

bench: venv descriptors jvm-archive
	$(PY) -m bench

# The stack needs no Java: these skip `doctor`, so `make down` works anywhere.
up: $(STAMP)
	$(FH) stack up

down: $(STAMP)
	$(FH) stack down

status: $(STAMP)
	$(FH) stack status

clean: down
	rm -rf .stack $(DESCRIPTORS) .pytest_cache .native-check

# README's configuration tables are generated from the settings' declarations (a unit test checks them).
readme: $(STAMP)
	$(PY) -c 'import re, pathlib; from firehose_bq import config as c, telemetry; from firehose_bq.devstack.stack_config import StackConfig; p = pathlib.Path("README.md"); t = p.read_text(); \
	t = re.sub(r"(<!-- config-reference:start -->\n).*?(\n<!-- config-reference:end -->)", lambda m: m[1] + c.reference_markdown() + m[2], t, flags=re.S); \
	t = re.sub(r"(<!-- stack-reference:start -->\n).*?(\n<!-- stack-reference:end -->)", lambda m: m[1] + c.reference_markdown((StackConfig,)) + m[2], t, flags=re.S); \
	t = re.sub(r"(<!-- metrics-reference:start -->\n).*?(\n<!-- metrics-reference:end -->)", lambda m: m[1] + telemetry.reference_markdown() + m[2], t, flags=re.S); \
	p.write_text(t)'
