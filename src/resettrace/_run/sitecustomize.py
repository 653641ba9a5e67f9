"""Loaded by Python at start-up in the processes of ``resettrace run -- COMMAND``.

It imports resettrace, which installs the spec named by ``RESETTRACE_INSTRUMENT``
before the command's own code runs, arranges the run record each process writes at
exit (``RESETTRACE_RUN_JSON``), and then runs the ``sitecustomize`` this one hides,
if any. A spec
that cannot be installed ends the process with one line on stderr and exit code 2.
"""

import importlib
import os
import sys


def _boot() -> None:
    try:
        import resettrace  # noqa: F401  (installs RESETTRACE_INSTRUMENT)
        from resettrace.instrumentation import InstrumentError, arrange_run
    except ModuleNotFoundError as e:
        if e.name != "resettrace":
            raise
        print(f"resettrace run: resettrace is not installed for {sys.executable}; run the "
              "command with the Python that has it (e.g. the venv's python)", file=sys.stderr,
              flush=True)
        os._exit(2)
    except Exception as e:  # noqa: BLE001 - one clear line instead of a start-up traceback
        name = type(e).__name__
        print(f"resettrace run: {e}" if name == "InstrumentError" else
              f"resettrace run: cannot install the instrument spec: {name}: {e}",
              file=sys.stderr, flush=True)
        os._exit(2)
    del InstrumentError
    arrange_run()


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path (a virtualenv's or a site's own)."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = list(sys.path)
    mine = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        try:
            importlib.import_module("sitecustomize")
        except ImportError as e:
            if e.name != "sitecustomize":
                raise
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


_boot()
_chain()
