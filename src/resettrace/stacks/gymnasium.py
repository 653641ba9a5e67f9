"""Gymnasium: vector env steps and MuJoCo env resets on the catalog.

``resettrace run --instrument gymnasium -- python train.py`` (or
``RESETTRACE_INSTRUMENT=gymnasium``, or ``resettrace.instrument("gymnasium")``)::

    env_step                          SyncVectorEnv.step / AsyncVectorEnv.step
      reset_done                      \\
        reset_done.reset_call          |  MujocoEnv.reset of one sub-env (an autoreset,
          dr_reset                     |  or the vector env's reset): count 1, the four
            set_state                 /   levels opened by the one call
              set_state.data_reset         mujoco.mj_resetData, inside set_state
              set_state.forward_kinematic  mujoco.mj_forward, inside set_state

A Gymnasium vector env resets one sub-env at a time, inside its step loop, with one call
that is the whole reset; so each reset is ``reset_done`` down to ``set_state`` with count
1, and a step that resets three sub-envs has three of them. The rest of ``set_state``
(seeding, the env's ``reset_model`` noise and its qpos/qvel writes, the reset
observation and info) is its gap. ``AsyncVectorEnv`` resets in its worker processes: there
the resets are traces of their own (``reset_done`` at the root), and ``env_step`` is
the parent's ``step`` (sending the actions and waiting for the results).

Only MuJoCo envs (``gymnasium.envs.mujoco.MujocoEnv`` and its subclasses, Gymnasium's
own and the ones users write) have their resets recorded; other envs' resets need a
target of their own in a spec (``"mypkg.env:MyEnv.reset" = {phase = "set_state",
count = 1, parents = true}``).
"""

from __future__ import annotations

from typing import Any

from resettrace.stacks import Instrumentation

_VECTOR = "gymnasium.vector"


def reset_targets() -> dict[str, Any]:
    """The targets of a MuJoCo env's reset (this instrumentation's and ``sb3``'s)."""
    return {
        "gymnasium.envs.mujoco.mujoco_env:MujocoEnv.reset": {
            "phase": "set_state", "count": 1, "parents": True},
        "mujoco:mj_resetData": {"phase": "set_state.data_reset", "within": "set_state"},
        "mujoco:mj_forward": {"phase": "set_state.forward_kinematic", "within": "set_state"},
    }


def spec() -> dict[str, Any]:
    return {
        "attributes": {"backend": "mujoco"},  # the envs whose resets it records
        "instrument": {
            f"{_VECTOR}.sync_vector_env:SyncVectorEnv.step": {
                "phase": "env_step", "env_count": "self.num_envs"},
            f"{_VECTOR}.async_vector_env:AsyncVectorEnv.step": {
                "phase": "env_step", "env_count": "self.num_envs"},
            **reset_targets(),
        },
    }


INSTRUMENTATION = Instrumentation(
    name="gymnasium", distribution="gymnasium", supported=">=1.0,<1.3",
    spec=spec,
    description="Gymnasium vector env steps and MuJoCo env resets (count 1 each)")
