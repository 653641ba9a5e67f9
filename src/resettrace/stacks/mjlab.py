"""mjlab (Isaac Lab's manager API on MuJoCo Warp): its env step and reset path on the catalog.

``resettrace run --instrument mjlab -- python train.py`` (or ``RESETTRACE_INSTRUMENT=mjlab``,
or ``resettrace.instrument("mjlab")``)::

    env_step                          ManagerBasedRlEnv.step          (env count: num_envs)
      env_step.apply_action           ActionManager.process_action, .apply_action (each
                                      physics substep: several calls a step)
      env_step.physics                Simulation.step                 (decimation calls a step)
      env_step.termination            TerminationManager.compute
      env_step.reward                 RewardManager.compute
      reset_done                      \\
        reset_done.reset_call          |  ManagerBasedRlEnv._reset_idx (count: env_ids; the
          dr_reset                    /   three levels opened by the one call)
            dr_reset.curriculum       CurriculumManager.compute
            set_state                 Simulation.reset                (count: env_ids)
              set_state.data_reset    mujoco_warp.reset_data (a CUDA graph's replay on a GPU)
            dr_reset.scene_reset      Scene.reset: the entities' buffers
            dr_reset.events           EventManager.apply, mode "reset": the randomization
              dr_reset.events.state_write   Entity.write_*_to_sim: the events' state writes
              (dr_reset_events_other_ms)    the rest of the events: the randomization
            dr_reset.managers_reset   each manager's reset(env_ids): 8 calls a reset
      env_step.forward                Simulation.forward: derived quantities of every env
                                      (and the task's command terms' own, where they call it)
      env_step.observation            ObservationManager.compute

``reset()`` (the first reset, or one with ``auto_reset=False``) runs ``_reset_idx`` outside a
step: a trace of its own, ``reset_done`` at the root.

**The post-reset forward.** mjlab calls ``Simulation.forward`` once a step, after the resets,
for every env: it brings the stepped envs' derived quantities up to date and the reset envs'
to their new state at once. It is ``env_step.forward``, outside ``reset_done``: it costs the
same whether 0 or all envs reset, so it is a cost of the step, not of a reset.

**Per call or per step.** A phase called several times under one parent (the physics
substeps, the action applied each substep, the managers' resets, the events' state writes)
has one sample per call: its ``p50`` is one call's, its ``count`` the calls. The per-key
table's "per parent" column says how many calls each parent holds.

**Events by mode.** ``EventManager.apply`` in mode "reset" is ``dr_reset.events``; the step's
events (modes "step" and "interval", a push, say) stay in ``env_step``'s gap, and so do
their state writes (recorded only inside ``dr_reset.events``).

**On a GPU** these spans time the host: a CUDA graph's replay (``wp.capture_launch``) or a
torch op only launches work, and the work shows where the host next waits for it: in mjlab
1.6 the managers' resets (the termination manager's and the command terms' ``.item()``, in
``dr_reset.managers_reset``) or the step's ``reset_buf.nonzero()`` (in ``env_step``'s gap).
The first env ids on the device say so in one line; see docs/instrument.md, "On a GPU".
"""

from __future__ import annotations

from typing import Any

from resettrace.stacks import Instrumentation

_M = "mjlab.managers"
#: the managers whose ``reset(env_ids)`` runs in each reset (their Null variants when a
#: task has none of that kind)
_MANAGERS = (
    ("observation_manager", "ObservationManager"),
    ("action_manager", "ActionManager"),
    ("reward_manager", "RewardManager"),
    ("metrics_manager", "MetricsManager"), ("metrics_manager", "NullMetricsManager"),
    ("curriculum_manager", "CurriculumManager"), ("curriculum_manager", "NullCurriculumManager"),
    ("command_manager", "CommandManager"), ("command_manager", "NullCommandManager"),
    ("event_manager", "EventManager"),
    ("termination_manager", "TerminationManager"),
)
#: the entity's state writes an event makes
_WRITES = ("write_root_state_to_sim", "write_root_link_pose_to_sim",
           "write_root_link_velocity_to_sim", "write_root_link_velocity_b_to_sim",
           "write_root_com_velocity_to_sim", "write_joint_state_to_sim",
           "write_joint_position_to_sim", "write_joint_velocity_to_sim")

PHASES = (
    ("env_step.termination", "env_step", "the termination manager's terms"),
    ("env_step.reward", "env_step", "the reward manager's terms"),
    ("env_step.forward", "env_step", "Simulation.forward after the resets: the derived "
     "quantities of every env (a cost of the step, whatever the envs reset)"),
    ("env_step.observation", "env_step", "the observation manager's terms"),
    ("dr_reset.curriculum", "dr_reset", "the curriculum manager's compute"),
    ("dr_reset.scene_reset", "dr_reset", "Scene.reset: the entities' buffers"),
    ("dr_reset.events", "dr_reset", "EventManager.apply in mode 'reset': the domain "
     "randomization and the state the events write (dr_reset_events_other_ms: all but "
     "the state writes)"),
    ("dr_reset.events.state_write", "dr_reset.events",
     "Entity.write_*_to_sim: the events' root and joint state writes (per call)"),
    ("dr_reset.managers_reset", "dr_reset",
     "each manager's reset(env_ids) (per call: about 8 a reset)"),
)

#: the phases whose own time (all but their children's) is a key of its own
GAPS = {"dr_reset.events": "dr_reset_events_other_ms"}


def spec() -> dict[str, Any]:
    envs = "self.num_envs"
    targets: dict[str, Any] = {
        "mjlab.envs.manager_based_rl_env:ManagerBasedRlEnv.step": {
            "phase": "env_step", "env_count": envs},
        f"{_M}.action_manager:ActionManager.process_action": {
            "phase": "env_step.apply_action", "within": "env_step"},
        f"{_M}.action_manager:ActionManager.apply_action": {
            "phase": "env_step.apply_action", "within": "env_step"},
        "mjlab.sim.sim:Simulation.step": {"phase": "env_step.physics", "within": "env_step"},
        f"{_M}.termination_manager:TerminationManager.compute": {
            "phase": "env_step.termination", "within": "env_step"},
        f"{_M}.reward_manager:RewardManager.compute": {
            "phase": "env_step.reward", "within": "env_step"},
        "mjlab.sim.sim:Simulation.forward": {"phase": "env_step.forward", "within": "env_step"},
        f"{_M}.observation_manager:ObservationManager.compute": {
            "phase": "env_step.observation", "within": "env_step"},
        # the reset: one call, three levels (None: every env, counted by num_envs)
        "mjlab.envs.manager_based_rl_env:ManagerBasedRlEnv._reset_idx": {
            "phase": "dr_reset", "count": "env_ids", "env_count": envs, "parents": True},
        f"{_M}.curriculum_manager:CurriculumManager.compute": {
            "phase": "dr_reset.curriculum", "within": "dr_reset"},
        "mjlab.sim.sim:Simulation.reset": {
            "phase": "set_state", "count": "env_ids", "within": "dr_reset"},
        "mujoco_warp:reset_data": {"phase": "set_state.data_reset", "within": "set_state"},
        "warp:capture_launch": {"phase": "set_state.data_reset", "within": "set_state"},
        "mjlab.scene.scene:Scene.reset": {
            "phase": "dr_reset.scene_reset", "count": "env_ids", "within": "dr_reset"},
        f"{_M}.event_manager:EventManager.apply": {
            "phase": "dr_reset.events", "count": "env_ids", "within": "dr_reset"},
    }
    for name in _WRITES:
        targets[f"mjlab.entity.entity:Entity.{name}"] = {
            "phase": "dr_reset.events.state_write", "count": "env_ids",
            "within": "dr_reset.events"}
    for module, cls in _MANAGERS:
        targets[f"{_M}.{module}:{cls}.reset"] = {
            "phase": "dr_reset.managers_reset", "count": "env_ids", "within": "dr_reset"}
    return {
        "attributes": {"backend": "mujoco_warp"},
        "phases": [{"span": s, "parent": p, "description": d,
                    **({"gap_key": GAPS[s]} if s in GAPS else {})} for s, p, d in PHASES],
        "instrument": targets,
    }


INSTRUMENTATION = Instrumentation(
    name="mjlab", distribution="mjlab", supported=">=1.6,<1.7",
    spec=spec,
    description="mjlab's ManagerBasedRlEnv: the step, its physics substeps and managers, "
                "and the reset path (_reset_idx, the sim's reset, events, managers' resets)")
