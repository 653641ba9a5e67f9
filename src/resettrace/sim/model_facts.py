"""What resettrace reads from a robot model, for every backend.

Both backends load the same MJCF; the facts the contract and the tasks rely on are read
here, once, with MuJoCo's compiler (a dependency of both): the floating-base layout, the
joints and actuators, the physics timestep, and the checks that refuse a model resettrace
would otherwise simulate wrongly (torque motors driven with joint angles, a control period
that is not a whole number of physics steps). No backend imports another for this.
"""

from __future__ import annotations

import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from resettrace.sim.contract import BackendInfo

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MODEL", "KEYFRAME", "load_model", "describe_model", "control_substeps",
           "motrix_option_differences", "check_position_actuators", "model_label",
           "keyframe_qpos", "robot_contact_geoms",
           "actuator_gains", "actuator_force_limits", "warn_once"]

DEFAULT_MODEL = Path(__file__).resolve().parent / "assets" / "g1" / "g1.xml"
KEYFRAME = "stand"

_warned: set[str] = set()  # warn_once keys already said


def model_label(m: mujoco.MjModel) -> str:
    """The model's name as its MJCF gives it (``<mujoco model=...>``)."""
    name = bytes(m.names).split(b"\x00", 1)[0].decode(errors="replace")
    return f"model {name!r}" if name else "the model"


def load_model(model: str | os.PathLike[str] | mujoco.MjModel | None) -> mujoco.MjModel:
    """An ``MjModel`` from a path to an MJCF file, a model, or the bundled G1.

    A file that does not compile raises ``ValueError`` with the path and MuJoCo's message
    (mesh paths in it are resolved against the model's ``meshdir``)."""
    if isinstance(model, mujoco.MjModel):
        return model
    path = Path(DEFAULT_MODEL if model is None else model)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    try:
        return mujoco.MjModel.from_xml_path(str(path))
    except ValueError as e:
        message = " ".join(str(e).split())
        # a file it names (a mesh, an include) is relative to the model's folder: say where
        for name in re.findall(r"'([^']+\.[A-Za-z0-9]+)'", message):
            if not os.path.isabs(name):
                message += f" (looked for {(path.parent / name).resolve()})"
        raise ValueError(f"{path}: MuJoCo cannot load the model: {message}") from None


def check_position_actuators(m: mujoco.MjModel) -> None:
    """Every actuator must be a position servo (``<position>``, or ``<general>`` with the
    same gain and bias): the tasks and ``set_state`` write joint angles into ``ctrl``.

    A torque motor (no position feedback) would apply those angles as N·m; the model is
    refused with the names of the actuators that are not position servos."""
    fixed = int(mujoco.mjtGain.mjGAIN_FIXED)
    affine = int(mujoco.mjtBias.mjBIAS_AFFINE)
    motors: list[str] = []
    others: list[str] = []
    for a in range(m.nu):
        name = mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_ACTUATOR, a) or f"actuator {a}"
        kp = float(m.actuator_gainprm[a, 0])
        bias = m.actuator_biasprm[a]
        if int(m.actuator_gaintype[a]) == fixed and int(m.actuator_biastype[a]) == affine \
                and kp > 0 and math.isclose(float(bias[1]), -kp, rel_tol=1e-9) \
                and float(bias[0]) == 0.0:
            continue  # force = kp * (ctrl - q) - kv * qdot: a position servo
        if int(m.actuator_biastype[a]) == int(mujoco.mjtBias.mjBIAS_NONE):
            motors.append(name)
        else:
            others.append(name)
    if not (motors or others):
        return
    parts = []
    if motors:
        parts.append(f"{len(motors)} torque motor(s) without position feedback "
                     f"({_names(motors)})")
    if others:
        parts.append(f"{len(others)} actuator(s) that are not position servos "
                     f"({_names(others)})")
    raise ValueError(
        "resettrace's tasks and set_state write joint angles as actuator targets, so every "
        "actuator must be a position servo (<position kp=... kv=...>); this model has "
        + " and ".join(parts))


def _names(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... {len(names) - limit} more" if len(names) > limit else "")


def control_substeps(control_dt: float, physics_dt: float) -> int:
    """Physics steps per control step: ``control_dt / physics_dt`` when that is a whole
    number (within float32 rounding of the timestep), else ``ValueError`` naming both."""
    if not (control_dt > 0 and math.isfinite(control_dt)):
        raise ValueError(f"control_dt must be a finite number of seconds > 0, got {control_dt}")
    if not (physics_dt > 0 and math.isfinite(physics_dt)):
        raise ValueError(f"the model's timestep must be > 0, got {physics_dt}")
    ratio = control_dt / physics_dt
    n = round(ratio)
    if n < 1 or abs(ratio - n) > 1e-4 * max(1.0, ratio):
        raise ValueError(
            f"control_dt {control_dt:g} s is not a whole number of the model's "
            f"{physics_dt:g} s timesteps ({ratio:.4g}); use a control_dt that is "
            f"(--control-dt {max(1, n) * physics_dt:.6g}, say) or change the model's "
            "<option timestep>")
    return int(n)


def describe_model(m: mujoco.MjModel, name: str, path: Any = None) -> BackendInfo:
    """Check the floating-base layout and actuators the contract needs; describe the model."""
    free = int(mujoco.mjtJoint.mjJNT_FREE)
    if m.njnt == 0 or int(m.jnt_type[0]) != free or int(m.jnt_qposadr[0]) != 0:
        raise ValueError("the model's first joint must be the floating base (a free joint)")
    hinge_types = [int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE)]
    if not np.isin(m.jnt_type[1:], hinge_types).all():
        raise ValueError("every joint after the floating base must be a hinge or slide joint")
    joint_names = tuple(mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_JOINT, j) or f"joint{j}"
                        for j in range(1, m.njnt))
    body_names = tuple(mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_BODY, b) or f"body{b}"
                       for b in range(m.nbody))
    act_names = tuple(mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_ACTUATOR, a) or f"act{a}"
                      for a in range(m.nu))
    if m.nu and (m.actuator_trntype != int(mujoco.mjtTrn.mjTRN_JOINT)).any():
        raise ValueError("every actuator must drive a joint")
    act_joint = (m.jnt_qposadr[m.actuator_trnid[:, 0]] - 7).astype(np.intp)
    if (act_joint < 0).any():
        raise ValueError("an actuator drives the floating base")
    check_position_actuators(m)
    _warn_without_floor(m, name)
    joint_range = np.array(m.jnt_range[1:], dtype=np.float64)
    unlimited = ~m.jnt_limited[1:].astype(bool)
    joint_range[unlimited] = (-np.inf, np.inf)
    ctrl_range = np.array(m.actuator_ctrlrange, dtype=np.float64)
    ctrl_range[~m.actuator_ctrllimited.astype(bool)] = (-np.inf, np.inf)
    return BackendInfo(name=name, joint_names=joint_names, body_names=body_names,
                       actuator_names=act_names, joint_range=joint_range, ctrl_range=ctrl_range,
                       actuator_joint=act_joint, physics_dt=float(m.opt.timestep),
                       model_path=None if path is None else str(path))


def _warn_without_floor(m: mujoco.MjModel, backend: str) -> None:
    """Warn (once per model) when nothing fixed to the world can collide: the robots would
    fall forever."""
    world_geoms = np.flatnonzero(m.geom_bodyid == 0)
    if any(int(m.geom_contype[g]) or int(m.geom_conaffinity[g]) for g in world_geoms):
        return
    warn_once(f"floor {model_label(m)} {m.nbody}",
              "resettrace: %s has no collision geometry fixed to the world (no floor): "
              "the robots fall without end", model_label(m))


#: geom types whose size fields scale the shape (a mesh's, height field's or SDF's size is
#: not its shape: the engines do not scale those)
_SCALABLE = {int(getattr(mujoco.mjtGeom, f"mjGEOM_{t}")) for t in
             ("PLANE", "SPHERE", "CAPSULE", "ELLIPSOID", "CYLINDER", "BOX")}


def robot_contact_geoms(m: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray]:
    """The robot's colliding geoms (not the world's): all of them, and those whose size
    domain randomization can scale; the first time a model has contact geoms it cannot
    scale, a warning names them."""
    contact = np.flatnonzero(((m.geom_contype | m.geom_conaffinity) != 0)
                             & (m.geom_bodyid != 0))
    scalable = np.array([g for g in contact if int(m.geom_type[g]) in _SCALABLE], np.intp)
    skipped = [mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_GEOM, int(g)) or f"geom {g}"
               for g in contact if int(m.geom_type[g]) not in _SCALABLE]
    if skipped:
        warn_once(f"sizes {model_label(m)} {skipped}",
                  "resettrace: geom size randomization leaves %d mesh (or height field) "
                  "contact geom(s) of %s at their size, which the engines cannot scale: %s",
                  len(skipped), model_label(m), _names(skipped))
    return contact, scalable


def keyframe_qpos(m: mujoco.MjModel) -> np.ndarray:
    """The reset pose: the keyframe named ``stand``, else the model's first keyframe, else
    its ``qpos0``."""
    key = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, KEYFRAME)
    if key < 0 and m.nkey:
        key = 0
    return np.array(m.key_qpos[key] if key >= 0 else m.qpos0, dtype=np.float64)


def actuator_gains(m: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray]:
    """Each position actuator's effective kp and kv as MuJoCo compiled them (``dampratio``
    resolved to kv)."""
    return (np.array(m.actuator_gainprm[:, 0], np.float64),
            -np.array(m.actuator_biasprm[:, 2], np.float64))


def actuator_force_limits(m: mujoco.MjModel) -> np.ndarray:
    """``(nu, 2)``: the force each actuator can apply in MuJoCo: its own ``forcerange``
    where force-limited, within its joint's ``actuatorfrcrange`` where that is set
    (``inf`` where neither limits it)."""
    out = np.tile([-np.inf, np.inf], (m.nu, 1))
    own = m.actuator_forcelimited.astype(bool)
    out[own] = m.actuator_forcerange[own]
    joints = m.actuator_trnid[:, 0]
    joint_limited = m.jnt_actfrclimited[joints].astype(bool)
    jr = m.jnt_actfrcrange[joints]
    out[joint_limited, 0] = np.maximum(out[joint_limited, 0], jr[joint_limited, 0])
    out[joint_limited, 1] = np.minimum(out[joint_limited, 1], jr[joint_limited, 1])
    return out


#: ``<option>`` settings that model physics MotrixSim has no setting for, with MuJoCo's
#: defaults: a model that changes one simulates something MotrixSim does not
_NO_MOTRIX_COUNTERPART = {"density": 0.0, "viscosity": 0.0, "impratio": 1.0,
                          "noslip_iterations": 0}
#: MuJoCo disable flags MotrixSim honours (``disable_contacts``, ``disable_gravity``)
_MOTRIX_FLAGS = int(mujoco.mjtDisableBit.mjDSBL_CONTACT) | int(
    mujoco.mjtDisableBit.mjDSBL_GRAVITY)
#: and those whose effect it cannot switch off: the model's physics differ
_PHYSICS_FLAGS = {
    "constraint": mujoco.mjtDisableBit.mjDSBL_CONSTRAINT,
    "equality": mujoco.mjtDisableBit.mjDSBL_EQUALITY,
    "frictionloss": mujoco.mjtDisableBit.mjDSBL_FRICTIONLOSS,
    "limit": mujoco.mjtDisableBit.mjDSBL_LIMIT, "spring": mujoco.mjtDisableBit.mjDSBL_SPRING,
    "damper": mujoco.mjtDisableBit.mjDSBL_DAMPER,
    "clampctrl": mujoco.mjtDisableBit.mjDSBL_CLAMPCTRL,
    "actuation": mujoco.mjtDisableBit.mjDSBL_ACTUATION,
}


def motrix_option_differences(m: mujoco.MjModel, options: Any) -> list[str]:
    """What of model ``m``'s ``<option>`` MotrixSim (its loaded ``options``) does not
    simulate as MuJoCo does, one ``name: MuJoCo value vs MotrixSim`` item each.

    Compared: timestep, gravity, iterations (``max_iterations``), tolerance (MotrixSim's
    loader takes its square root: ``solver_tolerance``), the contact and gravity flags.
    Reported when set: fluid forces (density, viscosity, wind), ``impratio``, an elliptic
    ``cone``, ``noslip_iterations`` and the disable flags of physics MotrixSim cannot
    switch off, none of which it has a setting for. The integrator and the solver are each
    engine's own and not compared."""
    opt = m.opt
    out: list[str] = []
    if not math.isclose(float(options.timestep), float(opt.timestep), rel_tol=1e-6):
        out.append(f"timestep: {opt.timestep:g} vs {float(options.timestep):g}")
    if not np.allclose(np.asarray(options.gravity, np.float64), opt.gravity, rtol=1e-6):
        out.append(f"gravity: {opt.gravity.tolist()} vs "
                   f"{np.asarray(options.gravity, np.float64).tolist()}")
    if int(options.max_iterations) != int(opt.iterations):
        out.append(f"iterations: {opt.iterations} vs {int(options.max_iterations)}")
    if not math.isclose(float(options.solver_tolerance), math.sqrt(opt.tolerance),
                        rel_tol=1e-4):
        out.append(f"tolerance: {opt.tolerance:g} (sqrt {math.sqrt(opt.tolerance):g}) vs "
                   f"{float(options.solver_tolerance):g}")
    flags = int(opt.disableflags)
    for name, bit in (("contact", mujoco.mjtDisableBit.mjDSBL_CONTACT),
                      ("gravity", mujoco.mjtDisableBit.mjDSBL_GRAVITY)):
        mj_off = bool(flags & int(bit))
        ms_off = bool(getattr(options, f"disable_{'contacts' if name == 'contact' else name}"))
        if mj_off != ms_off:
            out.append(f"{name} flag: {'disabled' if mj_off else 'enabled'} vs "
                       f"{'disabled' if ms_off else 'enabled'}")
    for name, default in _NO_MOTRIX_COUNTERPART.items():
        value = getattr(opt, name)
        if value != default:
            out.append(f"{name}: {value:g} (no MotrixSim setting)")
    if np.any(opt.wind != 0):
        out.append(f"wind: {opt.wind.tolist()} (no MotrixSim setting)")
    if opt.cone == mujoco.mjtCone.mjCONE_ELLIPTIC:
        out.append("cone: elliptic (no MotrixSim setting)")
    off = [name for name, bit in _PHYSICS_FLAGS.items() if flags & int(bit)]
    if off:
        out.append(f"disabled {', '.join(off)} (no MotrixSim setting)")
    return out


def warn_once(key: str, message: str, *args: Any) -> None:
    """A warning said once per process for ``key`` (a model and what is wrong with it)."""
    if key in _warned:
        return
    _warned.add(key)
    log.warning(message, *args)
