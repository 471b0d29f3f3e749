"""The native decoder's C extension; everything else is declared in pyproject.toml.

`optional=True`: without a C compiler the install still succeeds, and the job decodes with the Python
reference decoder (INPUT_SCHEMA_PROTO_DECODER=auto says so in one log line).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "firehose_bq.decode._native",
            sources=["firehose_bq/decode/_native.c"],
            extra_compile_args=["-std=gnu11", "-O3", "-fvisibility=hidden"],
            optional=True,
        )
    ]
)
