"""Every span name, timing key and attribute key of resettrace, defined once.

A :class:`Phase` is one timed stage of the reset hot path. It maps 1:1 between
an OpenTelemetry span name (``Phase.span``) and a timing key (``Phase.key``,
milliseconds), and names its parent phase so that the tree
``env_step > reset_done > dr_reset > set_state > set_state phases`` is known
without running anything. A phase whose parent declares a ``gap_key`` is part
of a closed account: ``parent = sum(children) + gap``.

Nothing else in the package spells a phase name, a timing key or an attribute
key as a string literal: import the constants from here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Phase",
    "PHASES",
    "BY_SPAN",
    "BY_KEY",
    "children_of",
    "SET_STATE_KEYS",
    "RESET_DONE_KEYS",
    "DR_RESET_KEYS",
    "ENV_STEP_KEYS",
    "ALL_KEYS",
]


@dataclass(frozen=True, slots=True)
class Phase:
    """One timed stage: its span name, timing key, parent and optional gap key."""

    index: int
    span: str
    key: str
    parent: str | None = None  # span name of the enclosing phase
    gap_key: str | None = None  # key of "self minus sum of children", if accounted
    description: str = ""


_PHASES: list[Phase] = []


def _phase(span: str, key: str, parent: Phase | None = None, *, gap_key: str | None = None,
           description: str = "") -> Phase:
    p = Phase(len(_PHASES), span, key, None if parent is None else parent.span, gap_key,
              description)
    _PHASES.append(p)
    return p


# --- env step -------------------------------------------------------------------------------
ENV_STEP = _phase("env_step", "env_step_total_ms", gap_key="env_step_other_ms",
                  description="one batched env step: action, physics, update_state, reset_done")
APPLY_ACTION = _phase("env_step.apply_action", "apply_action_ms", ENV_STEP,
                      description="policy action to actuator targets")
PHYSICS = _phase("env_step.physics", "physics_ms", ENV_STEP,
                 description="the backend's batched physics step (all substeps)")
UPDATE_STATE = _phase("env_step.update_state", "update_state_ms", ENV_STEP,
                      description="observation, reward and termination for every env")
RESET_DONE = _phase("reset_done", "reset_done_ms", ENV_STEP,
                    gap_key="reset_done_internal_gap_ms",
                    description="re-initialise the envs that finished")

# --- reset_done stages ------------------------------------------------------------------------
RESET_DONE_TERMINAL_OBS = _phase("reset_done.terminal_obs", "reset_done_terminal_obs_ms",
                                 RESET_DONE, description="copy the terminal observations")
RESET_DONE_RESET_CALL = _phase("reset_done.reset_call", "reset_done_reset_call_ms", RESET_DONE,
                               description="the call into the domain-randomization manager")
RESET_DONE_OBS_SCATTER = _phase("reset_done.obs_scatter", "reset_done_obs_scatter_ms",
                                RESET_DONE, description="reset observations into the batch")
RESET_DONE_INFO_SCATTER = _phase("reset_done.info_scatter", "reset_done_info_scatter_ms",
                                 RESET_DONE, description="episode bookkeeping of the reset rows")

# --- domain-randomization manager --------------------------------------------------------------
DR_RESET = _phase("dr_reset", "dr_reset_total_ms", RESET_DONE_RESET_CALL,
                  gap_key="dr_reset_internal_gap_ms",
                  description="plan, payload, set_state and reset observation")
DR_RESET_PLAN = _phase("dr_reset.plan", "dr_reset_plan_ms", DR_RESET,
                       description="sample the initial state of the reset rows")
DR_RESET_PAYLOAD_FILTER = _phase("dr_reset.payload_filter", "dr_reset_payload_filter_ms",
                                 DR_RESET, description="select the randomization rows")
SET_STATE = _phase("set_state", "dr_reset_set_state_ms", DR_RESET,
                   gap_key="set_state_internal_gap_ms",
                   description="backend.set_state: the authoritative set_state total")
DR_RESET_BUILD_OBSERVATION = _phase("dr_reset.build_observation",
                                    "dr_reset_build_observation_ms", DR_RESET,
                                    description="observation of the reset rows only")

# --- backend set_state phases (the contract's 15 measured keys) ---------------------------------
SET_STATE_MASK = _phase("set_state.mask", "set_state_mask_ms", SET_STATE,
                        description="validate ids, build the index (or mask) of the reset rows")
SET_STATE_DATA_SLICE = _phase("set_state.data_slice", "set_state_data_slice_ms", SET_STATE,
                              description="engine handle on the reset rows")
SET_STATE_DATA_RESET = _phase("set_state.data_reset", "set_state_data_reset_ms", SET_STATE,
                              description="reset the rows' engine data to the model defaults")
SET_STATE_CLEAR_FORCES = _phase("set_state.clear_forces", "set_state_clear_forces_ms",
                                SET_STATE, description="zero applied forces")
SET_STATE_GEOM_OVERRIDES = _phase("set_state.geom_overrides", "set_state_geom_overrides_ms",
                                  SET_STATE, description="per-env geom size overrides")
SET_STATE_RESET_RAND = _phase("set_state.reset_rand", "set_state_reset_rand_ms", SET_STATE,
                              description="per-env model randomization")
SET_STATE_SET_DOF_VEL = _phase("set_state.set_dof_vel", "set_state_set_dof_vel_ms", SET_STATE,
                               description="write qvel rows")
SET_STATE_SET_DOF_POS = _phase("set_state.set_dof_pos", "set_state_set_dof_pos_ms", SET_STATE,
                               description="write qpos rows")
SET_STATE_ACTUATOR_CTRL = _phase("set_state.actuator_ctrl", "set_state_actuator_ctrl_ms",
                                 SET_STATE, description="actuator targets hold the reset pose")
SET_STATE_FORWARD_KINEMATIC = _phase("set_state.forward_kinematic",
                                     "set_state_forward_kinematic_ms", SET_STATE,
                                     description="forward kinematics of the reset rows")
SET_STATE_REFRESH_POSE_CACHE = _phase("set_state.refresh_pose_cache",
                                      "set_state_refresh_pose_cache_ms", SET_STATE,
                                      description="body pose cache of the reset rows")
SET_STATE_INVALIDATE_VELOCITY = _phase("set_state.invalidate_velocity",
                                       "set_state_invalidate_velocity_ms", SET_STATE,
                                       description="drop cached velocities of the reset rows")
SET_STATE_QPOS_CONVERT = _phase("set_state.qpos_convert", "set_state_qpos_convert_ms",
                                SET_STATE,
                                description="contract qpos to the engine layout, unit quats")
SET_STATE_POOL_RESET = _phase("set_state.pool_reset", "set_state_pool_reset_ms", SET_STATE,
                              description="reset per-env engine pools")
SET_STATE_STATE_SCATTER = _phase("set_state.state_scatter", "set_state_state_scatter_ms",
                                 SET_STATE,
                                 description="per-row bookkeeping outside the state rows")

# --- task sub-phases (motion tracking) ---------------------------------------------------------
DR_RESET_MOTION_SAMPLE = _phase("dr_reset.plan.motion_sample", "dr_reset_motion_sample_ms",
                                DR_RESET_PLAN,
                                description="sample the reset rows' motion-clip start frames")
DR_RESET_MOTION_LOOKUP = _phase("dr_reset.plan.motion_lookup", "dr_reset_motion_lookup_ms",
                                DR_RESET_PLAN,
                                description="clip frames to initial qpos/qvel plus noise")
DR_RESET_BODY_POSE = _phase("dr_reset.build_observation.body_pose", "dr_reset_body_pose_ms",
                            DR_RESET_BUILD_OBSERVATION,
                            description="tracked body poses of the reset rows")

PHASES: tuple[Phase, ...] = tuple(_PHASES)
BY_SPAN: dict[str, Phase] = {p.span: p for p in PHASES}
BY_KEY: dict[str, Phase] = {p.key: p for p in PHASES}
if len(BY_SPAN) != len(PHASES) or len(BY_KEY) != len(PHASES):  # pragma: no cover
    raise RuntimeError("duplicate span name or timing key in the catalog")


def children_of(phase: Phase) -> tuple[Phase, ...]:
    """The phases whose parent is ``phase``, in catalog order."""
    return tuple(p for p in PHASES if p.parent == phase.span)


SET_STATE_PHASES: tuple[Phase, ...] = children_of(SET_STATE)
GAP_KEYS: tuple[str, ...] = tuple(p.gap_key for p in PHASES if p.gap_key)
GAP_PARENT: dict[str, Phase] = {p.gap_key: p for p in PHASES if p.gap_key}

#: The 16 keys of ``set_state(...)["timing"]``: 15 phases then the gap.
SET_STATE_KEYS: tuple[str, ...] = tuple(p.key for p in SET_STATE_PHASES) + (
    "set_state_internal_gap_ms",
)
assert SET_STATE.gap_key == SET_STATE_KEYS[-1] and len(SET_STATE_KEYS) == 16

#: Counts (not milliseconds) aggregated alongside the timing keys.
RESET_DONE_COUNT = "reset_done_count"

RESET_DONE_KEYS: tuple[str, ...] = (RESET_DONE_COUNT, RESET_DONE_TERMINAL_OBS.key,
                                    RESET_DONE_RESET_CALL.key, RESET_DONE_OBS_SCATTER.key,
                                    RESET_DONE_INFO_SCATTER.key, "reset_done_internal_gap_ms")
#: the last three are sub-phases of plan / build_observation (their % overlaps their parent's)
DR_RESET_KEYS: tuple[str, ...] = (DR_RESET.key, DR_RESET_PLAN.key, DR_RESET_PAYLOAD_FILTER.key,
                                  SET_STATE.key, DR_RESET_BUILD_OBSERVATION.key,
                                  "dr_reset_internal_gap_ms", DR_RESET_MOTION_SAMPLE.key,
                                  DR_RESET_MOTION_LOOKUP.key, DR_RESET_BODY_POSE.key)
ENV_STEP_KEYS: tuple[str, ...] = (ENV_STEP.key, APPLY_ACTION.key, PHYSICS.key, UPDATE_STATE.key,
                                  RESET_DONE.key, "env_step_other_ms")
ALL_KEYS: tuple[str, ...] = tuple(p.key for p in PHASES) + GAP_KEYS + (RESET_DONE_COUNT,)

# --- attribute keys ---------------------------------------------------------------------------
ATTR_ENV_COUNT = "resettrace.env.count"  # envs in the batch
ATTR_RESET_COUNT = "resettrace.reset.count"  # envs reset by this call
ATTR_BACKEND = "resettrace.backend.name"
ATTR_TASK = "resettrace.task.name"
ATTR_EXPORT_DROPPED = "resettrace.export.dropped"

#: Instrumentation scope of the spans resettrace materialises from its own records.
INSTRUMENTATION_SCOPE = "resettrace.recorder"
