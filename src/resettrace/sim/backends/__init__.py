"""Backend registry: simulator names to classes, imported only when asked for."""

from __future__ import annotations

from typing import Any

from resettrace.extras import require
from resettrace.registry import resolve

__all__ = ["BACKENDS", "backend_class", "make_backend"]

#: name -> "module:Class"; modules load on first use so that ``import resettrace`` stays light.
BACKENDS: dict[str, str] = {
    "mujoco": "resettrace.sim.backends.mujoco:MujocoBackend",
    "motrix": "resettrace.sim.backends.motrix:MotrixBackend",
}


def backend_class(name: str) -> Any:
    """The backend class registered as ``name``; unknown names list the known ones; a
    known one without the ``sim`` extra installed names it."""
    if name in BACKENDS:
        require("sim", f"the {name} backend")
    return resolve(BACKENDS, "backend", name)


def make_backend(name: str, *, num_envs: int, model: Any = None, **options: Any) -> Any:
    """Create the backend ``name`` with ``num_envs`` envs of ``model`` (default: bundled G1)."""
    return backend_class(name)(num_envs=num_envs, model=model, **options)
