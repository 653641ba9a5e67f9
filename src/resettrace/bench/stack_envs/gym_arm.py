"""A small Gymnasium MuJoCo env of our own (a two-link arm), as a user writes one, and
the script the Gymnasium instrumentation tests run under ``resettrace run``.

``python -m resettrace.bench.stack_envs.gym_arm MODE STEPS`` (MODE: ``sync``, ``fork``, ``spawn``)
steps a vector env of 4 arms with random actions and prints, as JSON, the resets that
happened (the vector env's own reset, then one per sub-env that ended in a step other
than the last: NextStep autoreset resets it in the next step).
"""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.mujoco import MujocoEnv

ENV_ID = "ResettraceTestArm-v0"
MAX_STEPS = 25

XML = """
<mujoco model="arm">
  <option timestep="0.01"/>
  <worldbody>
    <body name="upper" pos="0 0 0">
      <joint name="shoulder" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.04" mass="1"/>
      <body name="lower" pos="0 0 -0.5">
        <joint name="elbow" type="hinge" axis="0 1 0" damping="0.1"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.04" mass="1"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="shoulder" gear="5" ctrlrange="-1 1"/>
    <motor joint="elbow" gear="5" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""


class ArmEnv(MujocoEnv):
    """Swing the arm up; an episode ends when the elbow folds past 2.5 rad (or at the
    time limit)."""

    metadata = {"render_modes": ["human", "rgb_array", "depth_array"], "render_fps": 50}

    def __init__(self, **kwargs):
        import os
        import tempfile

        fd, path = tempfile.mkstemp(suffix=".xml")
        with os.fdopen(fd, "w") as f:
            f.write(XML)
        try:
            super().__init__(path, frame_skip=2, observation_space=spaces.Box(
                -np.inf, np.inf, (4,), np.float64), **kwargs)
        finally:
            os.unlink(path)

    def _obs(self):
        return np.concatenate([self.data.qpos, self.data.qvel])

    def step(self, action):
        self.do_simulation(action, self.frame_skip)
        obs = self._obs()
        terminated = bool(abs(self.data.qpos[1]) > 2.5)
        return obs, float(-abs(self.data.qpos[0] - np.pi)), terminated, False, {}

    def reset_model(self):
        qpos = self.init_qpos + self.np_random.uniform(-0.5, 0.5, self.model.nq)
        qvel = self.init_qvel + self.np_random.uniform(-0.5, 0.5, self.model.nv)
        self.set_state(qpos, qvel)
        return self._obs()


def register() -> None:
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=ArmEnv, max_episode_steps=MAX_STEPS)


def run(mode: str, steps: int, num_envs: int = 4) -> dict[str, int]:
    register()
    if mode == "sync":
        envs = gym.make_vec(ENV_ID, num_envs=num_envs, vectorization_mode="sync")
    else:
        envs = gym.make_vec(ENV_ID, num_envs=num_envs, vectorization_mode="async",
                            vector_kwargs={"context": mode})
    try:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        resets = num_envs
        for i in range(steps):
            _, _, term, trunc, _ = envs.step(envs.action_space.sample())
            if i < steps - 1:
                resets += int(np.count_nonzero(term | trunc))
    finally:
        envs.close()
    return {"resets": resets, "steps": steps, "num_envs": num_envs}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], int(sys.argv[2]))))
