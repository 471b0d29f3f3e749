"""The native decoders' C extensions; everything else is declared in pyproject.toml.

`optional=True`: without a C compiler (or on a platform an extension rejects, e.g. no 128-bit integers)
the install still succeeds, and the job decodes with the Python reference decoders
(INPUT_SCHEMA_PROTO_DECODER=auto says so in one log line).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    # protobuf wire bytes → Arrow (decode/native.py plans, _native.c decodes)
    Extension("firehose_bq.decode._native", ["firehose_bq/decode/_native.c"], optional=True,
              extra_compile_args=["-std=gnu11", "-O3", "-fvisibility=hidden"]),
    # JSON documents → Arrow, coerced to the table (decode/json_native.py)
    Extension("firehose_bq.decode._json", ["firehose_bq/decode/_json.c"], optional=True,
              extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"]),
])
