"""A small MotrixLab ``ManagerEnv`` of our own (a two-link inverted pendulum "arm" plus a
free-falling puck), as a user writes one: what the MotrixLab instrumentation's tests and
``resettrace bench stacks`` run.

The robot: a fixed base carrying two hinge joints (``shoulder``, ``elbow``, both about y)
with one motor actuator each (gear 2, ctrlrange [-1, 1]), balanced upright, plus a
collision-free freejoint body ``puck`` that falls under gravity. Nothing collides.

Episodes (``ctrl_dt`` 0.02 s, 2 physics substeps of 0.01 s):

- sim reset terms (MotrixLab's ``SimResetRuntime``, reset-mode write program: the reset
  rows are restored to the model defaults, then the terms' writes land):
  ``arm``: shoulder/elbow positions uniform in +-0.3 rad, velocities uniform in +-0.5
  rad/s (``JointPositionWrite`` + ``JointVelocityWrite``); ``puck``: floating-base
  position (1, 0, 2 + U(-0.25, 0.25)) and linear velocity (0, 0, U(-0.5, 0.5))
  (``BodyPositionWrite`` + ``BodyLinearVelocityWrite``).
- terminations: ``fallen``: ``|shoulder| > 0.7`` or ``|elbow| > 1.2`` rad (the pendulum
  falls over at a time that depends on its random start and the actions); the time-out is
  ``max_episode_seconds`` 0.6 s, i.e. truncation after 30 steps.
- observations (policy, 5 floats): shoulder/elbow position and velocity, puck height.
- rewards: ``upright`` (cos shoulder + cos(shoulder + elbow)), ``effort`` (-|a|^2, w 0.01).
- actions: ``motors``, 2 floats; clipped to [-1, 1] before they become ctrl targets.

``make_env(num_envs, seed)`` registers the env (idempotently) under :data:`ENV_NAME`, makes
it through ``motrix_env_core.registry.make(..., sim="motrixsim")`` and calls
``init_state()`` so that it is ready to step (the numba kernels are compiled there; the
initial reset of all rows happens there too, i.e. not in :func:`run`). ``run(env, steps,
seed)`` steps it with N(0, 1) actions and returns the number of env rows reset during
those steps.

Imports only numpy, motrix_env_core, motrix_env_motrixsim (via the registry), motrixsim
(via the backend) and the standard library.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from motrix_env_core import registry
from motrix_env_core.config import ManagerResetCfg, ResetTermCfg, SimCfg, configclass
from motrix_env_core.config.scene import SceneCfg
from motrix_env_core.manager import (
    ActionCfg,
    ActionState,
    ActionTerm,
    ManagerBasedEnvCfg,
    ManagerContext,
    ManagerEnv,
    ObservationTermCfg,
    ObsTerm,
    ResetTerm,
    RewardTerm,
    RewardTermCfg,
    TerminationTerm,
    TerminationTermCfg,
    dispatch,
)
from motrix_env_core.mdp.action_space import symmetric_residual_action_space
from motrix_env_core.numba.kernel_data import Map
from motrix_env_core.sim import JointPositionQuery, JointVelocityQuery, LinkPositionQuery
from motrix_env_core.sim.write import (
    BodyLinearVelocityWrite,
    BodyPositionWrite,
    JointPositionWrite,
    JointVelocityWrite,
)

ENV_NAME = "resettrace-test-motrixlab-arm"
BACKEND = "motrixsim"
JOINTS = ("shoulder", "elbow")
ACTUATORS = ("shoulder_motor", "elbow_motor")
CTRL_DT = 0.02
MAX_EPISODE_SECONDS = 0.6  # 30 control steps



def mjcf_path() -> Path:
    """The robot's MJCF (beside this module: MotrixLab scenes load from files)."""
    return Path(__file__).with_suffix(".xml")


# -- actions -------------------------------------------------------------------------


class MotorActionTerm(ActionTerm):
    """Raw actions, clipped to [-1, 1], become the motors' ctrl targets."""

    def _process(self, actions: np.ndarray) -> np.ndarray:
        return np.clip(actions, -1.0, 1.0)

    def _reset(self, env_ids: np.ndarray) -> None:
        pass


@configclass(kw_only=True)
class MotorActionCfg(ActionCfg):
    actuator_names: tuple[str, ...] | None = ACTUATORS

    def __call__(self, env, actuators) -> MotorActionTerm:
        n = len(actuators)
        state = ActionState(
            action_queue=np.zeros((env.num_envs, 2, n), dtype=np.float32),
            action_ptr=np.zeros(1, dtype=np.int64),
        )
        ranges = np.stack([np.full(n, -1.0, np.float32), np.full(n, 1.0, np.float32)])
        space = symmetric_residual_action_space(ranges, np.zeros(n, np.float32), 1.0)  # Box(-1, 1)
        return MotorActionTerm(space, state)


# -- sim reset terms -----------------------------------------------------------------


@dispatch
def reset_arm(ctx: ManagerContext, sim_writes: Map[np.ndarray], pos_range: np.float32,
              vel_range: np.float32) -> None:
    qpos = sim_writes["qpos"]
    qvel = sim_writes["qvel"]
    for i in range(qpos.shape[0]):
        qpos[i] = pos_range * ctx.rand.next_uniform()
        qvel[i] = vel_range * ctx.rand.next_uniform()


@configclass(kw_only=True)
class ArmResetCfg(ResetTermCfg):
    """Random shoulder/elbow positions (+-pos_range rad) and velocities (+-vel_range)."""

    pos_range: float = 0.3
    vel_range: float = 0.5

    def __call__(self, ctx) -> ResetTerm:
        return ResetTerm(
            reset_arm, np.float32(self.pos_range), np.float32(self.vel_range),
            writes={"qpos": JointPositionWrite(JOINTS), "qvel": JointVelocityWrite(JOINTS)},
        )


@dispatch
def reset_puck(ctx: ManagerContext, sim_writes: Map[np.ndarray], height: np.float32) -> None:
    pos = sim_writes["pos"]  # (1, 3): one floating body
    vel = sim_writes["vel"]
    pos[0, 0] = 1.0
    pos[0, 1] = 0.0
    pos[0, 2] = height + np.float32(0.25) * ctx.rand.next_uniform()
    vel[0, 0] = 0.0
    vel[0, 1] = 0.0
    vel[0, 2] = np.float32(0.5) * ctx.rand.next_uniform()


@configclass(kw_only=True)
class PuckResetCfg(ResetTermCfg):
    """The free puck back to about (1, 0, height), with a small random vertical speed."""

    height: float = 2.0

    def __call__(self, ctx) -> ResetTerm:
        return ResetTerm(
            reset_puck, np.float32(self.height),
            writes={"pos": BodyPositionWrite(("puck",)), "vel": BodyLinearVelocityWrite(("puck",))},
        )


@configclass
class ArmResetGroupCfg(ManagerResetCfg):
    arm: ArmResetCfg = ArmResetCfg()
    puck: PuckResetCfg = PuckResetCfg()


# -- observations --------------------------------------------------------------------


@dispatch
def arm_state_obs(ctx: ManagerContext, out: np.ndarray, qpos: np.ndarray, qvel: np.ndarray,
                  puck_pos: np.ndarray) -> None:
    out[0] = qpos[0]
    out[1] = qpos[1]
    out[2] = qvel[0]
    out[3] = qvel[1]
    out[4] = puck_pos[2]


@configclass(kw_only=True)
class ArmStateObsCfg(ObservationTermCfg):
    def __call__(self, ctx) -> ObsTerm:
        return ObsTerm(5, arm_state_obs, JointPositionQuery(joints=JOINTS),
                       JointVelocityQuery(joints=JOINTS), LinkPositionQuery(link="puck"))


# -- rewards -------------------------------------------------------------------------


@dispatch
def upright_reward(ctx: ManagerContext, qpos: np.ndarray) -> float:
    return math.cos(qpos[0]) + math.cos(qpos[0] + qpos[1])


@configclass(kw_only=True)
class UprightRewardCfg(RewardTermCfg):
    def __call__(self, ctx) -> RewardTerm:
        return RewardTerm(upright_reward, JointPositionQuery(joints=JOINTS))


@dispatch
def effort_reward(ctx: ManagerContext) -> float:
    action = ctx.actions["motors"].current()
    return -float(np.dot(action, action))


@configclass(kw_only=True)
class EffortRewardCfg(RewardTermCfg):
    def __call__(self, ctx) -> RewardTerm:
        return RewardTerm(effort_reward)


# -- terminations --------------------------------------------------------------------


@dispatch
def fallen_termination(ctx: ManagerContext, qpos: np.ndarray, shoulder_limit: np.float32,
                       elbow_limit: np.float32) -> bool:
    return abs(qpos[0]) > shoulder_limit or abs(qpos[1]) > elbow_limit


@configclass(kw_only=True)
class FallenTerminationCfg(TerminationTermCfg):
    shoulder_limit: float = 0.7
    elbow_limit: float = 1.2

    def __call__(self, ctx) -> TerminationTerm:
        return TerminationTerm(fallen_termination, JointPositionQuery(joints=JOINTS),
                               np.float32(self.shoulder_limit), np.float32(self.elbow_limit))


# -- env config and registration -----------------------------------------------------


def make_cfg() -> ManagerBasedEnvCfg:
    """Two-link inverted pendulum arm plus a falling puck (resettrace test env).

    A plain ``ManagerBasedEnvCfg`` (no subclass), so that the registered config type
    stays the same class when this module is reloaded or imported under another name."""
    return ManagerBasedEnvCfg(
        scene=SceneCfg(file=str(mjcf_path())),
        sim=SimCfg(dt=0.01),
        ctrl_dt=CTRL_DT,
        max_episode_seconds=MAX_EPISODE_SECONDS,
        sim_reset=ArmResetGroupCfg(),
        actions={"motors": MotorActionCfg()},
        observations={"policy": {"arm_state": ArmStateObsCfg()}},
        rewards={"upright": UprightRewardCfg(weight=1.0), "effort": EffortRewardCfg(weight=0.01)},
        terminations={"fallen": FallenTerminationCfg()},
    )


def register() -> None:
    """Register the config factory and ManagerEnv under ENV_NAME; a no-op when already
    registered (a second import, a second make_env, or the module imported under another
    name: the first registration wins)."""
    if not registry.contains(ENV_NAME):
        registry.register_env_config(ENV_NAME, make_cfg)
    if not registry.list_registered_envs()[ENV_NAME]["available_backends"]:
        registry.register_env(ENV_NAME, ManagerEnv)


register()


def make_env(num_envs: int = 16, seed: int = 0) -> ManagerEnv:
    """A ready-to-step ``ManagerEnv`` (``registry.make(ENV_NAME, num_envs=num_envs,
    sim="motrixsim", seed=seed)`` followed by ``init_state()``, which compiles the numba
    kernels and resets every row once)."""
    register()
    env = registry.make(ENV_NAME, num_envs=num_envs, sim=BACKEND, seed=seed)
    assert isinstance(env, ManagerEnv)
    env.init_state()
    return env


def run(env: ManagerEnv, steps: int, seed: int = 0) -> int:
    """Step ``env`` ``steps`` times with N(0, 1) float32 actions and return how many env
    rows were reset during those steps, i.e. the number of env ids ``ManagerEnv.reset``
    received. After ``ArrayEnv.step`` returns, ``state.done`` (terminated | truncated)
    still marks exactly the rows that step reset (auto-reset happens inside the step; the
    flags are cleared at the start of the next one). An env not yet initialised resets all
    of its rows in its first step (``init_state``), which is counted too."""
    rng = np.random.default_rng(seed)
    num_envs = env.num_envs
    dim = env.action_space.shape[0]
    resets = 0
    if env.state is None:
        resets += num_envs
    for _ in range(steps):
        actions = rng.standard_normal((num_envs, dim)).astype(np.float32)
        state = env.step(actions)
        resets += int(np.count_nonzero(state.done))
    return resets


if __name__ == "__main__":
    # python -m resettrace.bench.stack_envs.motrixlab_arm STEPS [NUM_ENVS]: the resets that
    # happened as JSON (the initial reset of every row at make, then those of the steps)
    import json
    import sys

    n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    made = make_env(n)
    print(json.dumps({"initial": n, "resets": run(made, int(sys.argv[1])), "num_envs": n}))
