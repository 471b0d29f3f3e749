"""Builds the optional native JSON decoder; everything else is declared in pyproject.toml.

`optional=True`: without a C compiler (or on a platform the extension rejects, e.g. no 128-bit integers)
the install still succeeds and the Python reference decoder is used (firehose_bq.decode.make_json_decoder).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("firehose_bq.decode._json", ["firehose_bq/decode/_json.c"], optional=True,
              extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"]),
])
