"""The one compiled part: the recorder's hot path (optional; see its source's header)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("resettrace.tracing._fast", ["src/resettrace/tracing/_fast.c"],
                             optional=True)])
