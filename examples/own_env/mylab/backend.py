"""A batched cart-pole on MuJoCo: one ``MjData`` per env. Level 1: recorder scopes.

``set_state`` times its phases with the built-in set_state phase names plus one
phase of its own, so ``set_state(...)["timing"]`` is resettrace's closed timing
dict: the 16 canonical keys, ``set_state_warm_start_clear_ms``, then the gap.
"""

from __future__ import annotations

import mujoco
import numpy as np

import resettrace

CARTPOLE = """
<mujoco model="cartpole">
  <option timestep="0.01"/>
  <worldbody>
    <body name="cart">
      <joint name="slide" type="slide" axis="1 0 0" range="-2 2" limited="true"/>
      <geom type="box" size="0.2 0.1 0.05" mass="1"/>
      <body name="pole">
        <joint name="hinge" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0 0 0.6" size="0.03" mass="0.1"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor joint="slide" gear="10" ctrlrange="-1 1" ctrllimited="true"/></actuator>
</mujoco>
"""

#: a phase of this backend's own, inside set_state
WARM_START_CLEAR = resettrace.register_phase(
    "set_state.warm_start_clear", parent="set_state",
    description="zero the solver warm start of the reset rows")


class CartPoleBackend:
    """``num_envs`` cart-poles; ``set_state(env_ids, qpos, qvel)`` re-initialises rows."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.model = mujoco.MjModel.from_xml_string(CARTPOLE)
        self.data = [mujoco.MjData(self.model) for _ in range(num_envs)]
        self.nq, self.nv = self.model.nq, self.model.nv
        # used when the caller binds no recorder of its own
        self.recorder = resettrace.recorder(backend="mylab-cartpole", env_count=num_envs)

    def step(self, ctrl: np.ndarray, substeps: int) -> None:
        for d, c in zip(self.data, ctrl, strict=True):
            d.ctrl[:] = c
            for _ in range(substeps):
                mujoco.mj_step(self.model, d)

    def qpos(self) -> np.ndarray:
        return np.array([d.qpos for d in self.data])

    def qvel(self) -> np.ndarray:
        return np.array([d.qvel for d in self.data])

    def set_state(self, env_ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> dict | None:
        rec = resettrace.current_recorder(self.recorder)
        with rec.scope("set_state", len(env_ids)) as outer:
            with rec.scope("set_state.mask"):
                ids = np.asarray(env_ids, dtype=np.intp)
                if ids.ndim != 1 or ids.size and (ids.min() < 0 or ids.max() >= self.num_envs):
                    raise ValueError(f"env_ids must be 1-D ids in [0, {self.num_envs})")
                if qpos.shape != (ids.size, self.nq) or qvel.shape != (ids.size, self.nv):
                    raise ValueError("qpos / qvel must have one row per env id")
            with rec.scope("set_state.data_reset"):
                for i in ids:
                    mujoco.mj_resetData(self.model, self.data[i])
            with rec.scope("set_state.set_dof_pos"):
                for i, q in zip(ids, qpos, strict=True):
                    self.data[i].qpos[:] = q
            with rec.scope("set_state.set_dof_vel"):
                for i, v in zip(ids, qvel, strict=True):
                    self.data[i].qvel[:] = v
            with rec.scope(WARM_START_CLEAR):
                for i in ids:
                    self.data[i].qacc_warmstart[:] = 0.0
            with rec.scope("set_state.forward_kinematic"):
                for i in ids:
                    mujoco.mj_kinematics(self.model, self.data[i])
        timing = outer.timing()
        return None if timing is None else {"timing": timing}
