"""The one compiled part: the recorder's hot path (optional; see its source's header).

An install that cannot build it (no C compiler, no Python headers) still installs, and
says so in one line; the pure-Python recorder then records the same records (slower: see
docs/benchmarks.md). ``RESETTRACE_PURE_PYTHON=1`` chooses that recorder at run time."""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext whose failure is one line, not a page of compiler output."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler found: setuptools raises before compiling
            self._said(e)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
            self._said(e)

    @staticmethod
    def _said(e: BaseException) -> None:
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        print(f"resettrace: the compiled recorder was not built ({reason}); the pure-Python "
              "recorder will record instead (same records, more cost per scope)",
              file=sys.stderr)


setup(ext_modules=[Extension("resettrace.tracing._fast", ["src/resettrace/tracing/_fast.c"],
                             depends=["src/resettrace/tracing/_layout.h"])],
      cmdclass={"build_ext": OptionalBuildExt})
