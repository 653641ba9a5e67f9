"""Zero-code tracing: wrap existing functions and methods from a spec.

A spec (a TOML file or the same as a mapping) names span attributes, phases of
your own and the functions to record::

    [attributes]                       # on every span (backend, task, env_count or any key)
    backend = "mylab-mujoco"

    [[phases]]                         # phases of your own (register_phase's arguments)
    span = "dr_reset.terrain_sample"
    parent = "dr_reset"

    [instrument]                       # "module:Qualified.name" = phase, or a table
    "mylab.env:MyEnv.step" = "env_step"
    "mylab.env:MyEnv.reset_done" = { phase = "reset_done", count = "self.done" }

    [instrument."mylab.backend:MyBackend.set_state"]  # a table on lines of its own (TOML's
    phase = "set_state"                               # inline tables fit on one line)
    count = "env_ids"
    env_count = "self.num_envs"

Each target is wrapped with :func:`resettrace.traced` (``count`` and ``env_count``
as there). A module already imported is patched at once; any other when it is
first imported (a ``sys.meta_path`` hook), so the spec can be installed before the
training code starts. Errors in the spec and targets that cannot be wrapped (unknown
module, missing attribute, not a function, a generator or async function, a count
argument it does not have, an unknown phase) raise :class:`InstrumentError` naming
them: at once where possible, else from the import of the module. The spec of
``RESETTRACE_INSTRUMENT`` (what ``resettrace run`` installs) instead ends the process
with one line on stderr and exit code 2, at start-up or at that import.

:func:`instrument` returns an ``undo()`` that restores every original. The
``RESETTRACE_INSTRUMENT=SPEC`` variable makes ``import resettrace`` install the
spec (what ``resettrace run`` sets up, with a ``sitecustomize`` on ``PYTHONPATH``).
"""

from resettrace.config import ENV_INSTRUMENT
from resettrace.instrumentation.install import instrument, instrument_from_env
from resettrace.instrumentation.patching import when_imported
from resettrace.instrumentation.run import arrange_run, check_spec
from resettrace.instrumentation.spec import InstrumentError, Target, load_spec

__all__ = ["instrument", "instrument_from_env", "check_spec", "InstrumentError", "load_spec",
           "Target", "ENV_INSTRUMENT", "arrange_run", "when_imported"]
