"""Stable-Baselines3: its vector env steps and the MuJoCo env resets under them.

``resettrace run --instrument sb3 -- python train.py``::

    env_step                          DummyVecEnv.step_wait / SubprocVecEnv.step_wait
      reset_done                      \\
        reset_done.reset_call          |  MujocoEnv.reset of one env (an autoreset, or
          dr_reset                     |  the vector env's reset): count 1, the four
            set_state                 /   levels opened by the one call
              set_state.data_reset         mujoco.mj_resetData, inside set_state
              set_state.forward_kinematic  mujoco.mj_forward, inside set_state

SB3's vector envs are its own (``stable_baselines3.common.vec_env``), not Gymnasium's:
``step_wait`` is the step of all envs, with the vector env's ``num_envs`` as its env count.
``DummyVecEnv`` steps and resets its envs in the training process, so each reset is inside
the step; ``SubprocVecEnv`` (forkserver by default on Linux, fork and spawn too) steps them in
worker processes, one env each: there a reset is a trace of its own (``reset_done`` at the
root), and ``env_step`` is the main process's wait for all workers. Every process writes its
own record, and ``resettrace run`` merges them into the job's.

The resets are the ``gymnasium`` instrumentation's (MuJoCo envs only); with both
(``--instrument gymnasium,sb3``) each target is recorded once.
"""

from __future__ import annotations

from typing import Any

from resettrace.stacks import Instrumentation

_VEC = "stable_baselines3.common.vec_env"


def spec() -> dict[str, Any]:
    from resettrace.stacks.gymnasium import reset_targets

    return {
        "attributes": {"backend": "mujoco"},
        "instrument": {
            f"{_VEC}.dummy_vec_env:DummyVecEnv.step_wait": {
                "phase": "env_step", "env_count": "self.num_envs"},
            f"{_VEC}.subproc_vec_env:SubprocVecEnv.step_wait": {
                "phase": "env_step", "env_count": "self.num_envs"},
            **reset_targets(),
        },
    }


INSTRUMENTATION = Instrumentation(
    name="sb3", distribution="stable-baselines3", supported=">=2.0,<3",
    spec=spec,
    description="Stable-Baselines3 vector env steps (DummyVecEnv, SubprocVecEnv) and MuJoCo "
                "env resets (count 1 each)")
