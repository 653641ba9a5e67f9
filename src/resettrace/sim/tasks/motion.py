"""Reference motion clips for motion tracking, and the sampler of their start frames.

Clip format (a :class:`MotionClip`, or a ``.npz`` file with these keys; ``T >= 2``
frames, ``J`` hinge joints in the model's qpos order, ``B`` tracked bodies):

================  ============  ======================================================
key               shape         meaning
================  ============  ======================================================
``fps``           scalar        frames per second, > 0
``joint_pos``     (T, J)        hinge joint positions (rad)
``joint_vel``     (T, J)        hinge joint velocities (rad/s)
``body_names``    (B,) str      tracked bodies; ``body_names[0]`` is the floating-base
                                body (the root: pelvis on the G1)
``body_pos``      (T, B, 3)     world positions of the body frames (m)
``body_quat``     (T, B, 4)     world orientations, unit quaternions **wxyz**
``body_lin_vel``  (T, B, 3)     world-frame linear velocities of the body frames (m/s)
``body_ang_vel``  (T, B, 3)     world-frame angular velocities (rad/s)
``joint_names``   (J,) str      optional: the clip's joints by name, mapped to the model's
                                joints by name (without it, ``J`` joints in the model's
                                qpos order)
================  ============  ======================================================

:func:`generate_clip` builds a deterministic walking clip with the project's own
gait generator and MuJoCo forward kinematics (MuJoCo is imported only there), so
the task runs without any user data; :func:`load_clip` / :func:`save_clip` read and
write user clips.

:class:`MotionSampler` picks the start frame of each reset. Its ``adaptive`` mode
keeps a per-bin failure EMA and samples bins where episodes fail more often (the
formula is in its docstring).

The quaternion helpers here (``q*``) work on any leading shape ``(..., 4)``; the
two-dimensional ones of :mod:`resettrace.sim.tasks.quat` do not.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from resettrace.sim.tasks.quat import (
    qangle,
    qconj,
    qlog,
    qmul,
    qrot,
    qrot_inv,
    quat_from_euler,
    qyaw,
)

__all__ = [
    "CLIP_KEYS",
    "DEFAULT_TRACKED_BODIES",
    "MotionClip",
    "MotionSampler",
    "generate_clip",
    "load_clip",
    "save_clip",
    "qconj",
    "qmul",
    "qrot",
    "qrot_inv",
    "qyaw",
    "qangle",
    "qlog",
    "quat_from_euler",
]

#: the keys of a clip ``.npz`` file, in the order they are checked
CLIP_KEYS: tuple[str, ...] = ("fps", "joint_pos", "joint_vel", "body_names", "body_pos",
                              "body_quat", "body_lin_vel", "body_ang_vel")

#: 14 G1 bodies: the root, the anchor (torso), then legs and arms
DEFAULT_TRACKED_BODIES: tuple[str, ...] = (
    "pelvis", "torso_link",
    "left_hip_roll_link", "left_knee_link", "left_ankle_roll_link",
    "right_hip_roll_link", "right_knee_link", "right_ankle_roll_link",
    "left_shoulder_roll_link", "left_elbow_link", "left_wrist_yaw_link",
    "right_shoulder_roll_link", "right_elbow_link", "right_wrist_yaw_link",
)

#: quaternion norms further than this from 1 are rejected (float32 sources pass)
_UNIT_TOL = 1e-3


# -- the clip -------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class MotionClip:
    """One reference motion (see the module docstring for the arrays).

    Construction validates every array (:meth:`validate`), stores read-only float64
    copies and renormalises the quaternions, so a clip is immutable and usable as is.
    """

    fps: float
    joint_pos: np.ndarray
    joint_vel: np.ndarray
    body_names: tuple[str, ...]
    body_pos: np.ndarray
    body_quat: np.ndarray
    body_lin_vel: np.ndarray
    body_ang_vel: np.ndarray
    #: the joints of joint_pos / joint_vel by name (empty: the model's hinge joints in order)
    joint_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field_name in ("body_names", "joint_names"):
            names = getattr(self, field_name)
            if isinstance(names, str) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"{field_name} must be a sequence of names, got {names!r}")
            object.__setattr__(self, field_name, tuple(names))
        for key in ("joint_pos", "joint_vel", "body_pos", "body_quat", "body_lin_vel",
                    "body_ang_vel"):
            try:
                value = np.array(getattr(self, key), dtype=np.float64, copy=True)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{key} must be a numeric array ({e})") from None
            object.__setattr__(self, key, value)
        try:
            fps = float(np.asarray(self.fps).item())
        except (TypeError, ValueError) as e:
            raise ValueError(f"fps must be one number, got {self.fps!r} ({e})") from None
        object.__setattr__(self, "fps", fps)
        self.validate()
        quat = self.body_quat
        norm = np.linalg.norm(quat, axis=-1)
        off = np.abs(norm - 1.0) > 1e-12  # idempotent: a saved clip loads back bit-identical
        quat[off] /= norm[off][:, None]
        for key in ("joint_pos", "joint_vel", "body_pos", "body_quat", "body_lin_vel",
                    "body_ang_vel"):
            getattr(self, key).setflags(write=False)

    @property
    def num_frames(self) -> int:
        return int(self.joint_pos.shape[0])

    @property
    def num_joints(self) -> int:
        return int(self.joint_pos.shape[1])

    def for_joints(self, joints: tuple[str, ...]) -> MotionClip:
        """This clip with its joint columns in the order of ``joints`` (a model's hinge
        joints), mapped by name; ``ValueError`` listing the joints the clip lacks. A clip
        without joint names must have exactly ``len(joints)`` joints, in that order."""
        if not self.joint_names:
            if self.num_joints != len(joints):
                raise ValueError(f"the clip has {self.num_joints} joints (no names), the model "
                                 f"{len(joints)}; save the clip with joint_names to map them")
            return dataclasses.replace(self, joint_names=tuple(joints))
        index = {n: i for i, n in enumerate(self.joint_names)}
        missing = [j for j in joints if j not in index]
        if missing:
            raise ValueError(f"the clip has no column for {len(missing)} of the model's joints:"
                             f" {', '.join(missing)}")
        if tuple(joints) == self.joint_names:
            return self
        cols = np.array([index[j] for j in joints], dtype=np.intp)
        return dataclasses.replace(self, joint_pos=self.joint_pos[:, cols],
                                   joint_vel=self.joint_vel[:, cols], joint_names=tuple(joints))

    def validate(self) -> MotionClip:
        """Raise ``ValueError`` naming the first problem: fps, shapes, finiteness, unit quats."""
        if not np.isfinite(self.fps) or self.fps <= 0.0:
            raise ValueError(f"fps must be a finite number > 0, got {self.fps}")
        jp = self.joint_pos
        if jp.ndim != 2 or jp.shape[0] < 2 or jp.shape[1] < 1:
            raise ValueError(f"joint_pos must have shape (T, J) with T >= 2 frames and J >= 1 "
                             f"joints, got {jp.shape}")
        t, _ = jp.shape
        if self.joint_names and (len(self.joint_names) != jp.shape[1]
                                 or len(set(self.joint_names)) != jp.shape[1]):
            raise ValueError(f"joint_names must be {jp.shape[1]} unique names (one per column "
                             f"of joint_pos), got {len(self.joint_names)}")
        if self.joint_vel.shape != jp.shape:
            raise ValueError(f"joint_vel has shape {self.joint_vel.shape}, expected {jp.shape} "
                             "(the shape of joint_pos)")
        b = len(self.body_names)
        if b < 1 or len(set(self.body_names)) != b:
            raise ValueError(f"body_names must be at least one unique name, got "
                             f"{self.body_names}")
        for key, width in (("body_pos", 3), ("body_quat", 4), ("body_lin_vel", 3),
                           ("body_ang_vel", 3)):
            shape = getattr(self, key).shape
            if shape != (t, b, width):
                raise ValueError(f"{key} has shape {shape}, expected (T, B, {width}) = "
                                 f"({t}, {b}, {width}) from joint_pos and body_names")
        for key in ("joint_pos", "joint_vel", "body_pos", "body_quat", "body_lin_vel",
                    "body_ang_vel"):
            bad = ~np.isfinite(getattr(self, key))
            if bad.any():
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                raise ValueError(f"{key} has {int(bad.sum())} non-finite value(s), the first at "
                                 f"index {where}")
        norm = np.linalg.norm(self.body_quat, axis=-1)
        off = np.abs(norm - 1.0) > _UNIT_TOL
        if off.any():
            f, j = (int(i) for i in np.argwhere(off)[0])
            raise ValueError(f"body_quat holds {int(off.sum())} non-unit quaternion(s), the first "
                             f"at frame {f}, body {self.body_names[j]!r} (norm {norm[f, j]:.6g}); "
                             "quaternions must be unit wxyz")
        return self


def load_clip(path: str | os.PathLike[str]) -> MotionClip:
    """Read a clip ``.npz`` (:data:`CLIP_KEYS`); ``ValueError`` naming the file and problem."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"motion clip not found: {p}")
    try:
        with np.load(p, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("not a .npz archive (a single .npy array)")
            missing = [k for k in CLIP_KEYS if k not in data.files]
            if missing:
                raise ValueError(f"missing key(s) {missing}; a motion clip needs "
                                 f"{list(CLIP_KEYS)}")
            arrays: dict[str, Any] = {k: data[k] for k in CLIP_KEYS}
            joint_names = data["joint_names"] if "joint_names" in data.files else None
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"{p}: not a readable .npz archive ({e})") from None
    names = arrays["body_names"]
    if names.ndim != 1 or names.dtype.kind not in "US":
        raise ValueError(f"{p}: body_names must be a 1-D array of strings, got dtype "
                         f"{names.dtype} shape {names.shape}")
    if np.size(arrays["fps"]) != 1:
        raise ValueError(f"{p}: fps must be one number, got shape {np.shape(arrays['fps'])}")
    try:
        return MotionClip(fps=arrays["fps"], joint_pos=arrays["joint_pos"],
                          joint_vel=arrays["joint_vel"],
                          body_names=tuple(str(n) for n in names),
                          body_pos=arrays["body_pos"], body_quat=arrays["body_quat"],
                          body_lin_vel=arrays["body_lin_vel"],
                          body_ang_vel=arrays["body_ang_vel"],
                          joint_names=() if joint_names is None
                          else tuple(str(n) for n in np.atleast_1d(joint_names)))
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None


def save_clip(clip: MotionClip, path: str | os.PathLike[str]) -> Path:
    """Write ``clip`` as an uncompressed ``.npz``; returns the path written (numpy adds
    ``.npz`` when the name lacks it)."""
    p = Path(path)
    if p.suffix != ".npz":
        p = p.with_name(p.name + ".npz")
    np.savez(p, fps=np.float64(clip.fps), joint_pos=clip.joint_pos, joint_vel=clip.joint_vel,
             body_names=np.array(clip.body_names, dtype=str), body_pos=clip.body_pos,
             body_quat=clip.body_quat, body_lin_vel=clip.body_lin_vel,
             body_ang_vel=clip.body_ang_vel, joint_names=np.array(clip.joint_names, dtype=str))
    return p


# -- the built-in walking clip ---------------------------------------------------------------
#: gait joints: name -> (the leg whose phase drives it, amplitude, shape), added to the
#: stand pose: "sin" = amp * sin(psi), "flex" = amp * (1 - cos(psi)) / 2 (peaks mid-swing),
#: "flat" = minus that leg's hip and knee pitch changes (the sole stays level)
_GAIT: dict[str, tuple[str, float, str]] = {
    "left_hip_pitch_joint": ("left", 0.30, "sin"),
    "right_hip_pitch_joint": ("right", 0.30, "sin"),
    "left_knee_joint": ("left", 0.30, "flex"),
    "right_knee_joint": ("right", 0.30, "flex"),
    "left_ankle_pitch_joint": ("left", 0.0, "flat"),
    "right_ankle_pitch_joint": ("right", 0.0, "flat"),
    # arms swing with the opposite leg: forward when it is forward
    "left_shoulder_pitch_joint": ("right", 0.30, "sin"),
    "right_shoulder_pitch_joint": ("left", 0.30, "sin"),
    "left_elbow_joint": ("right", 0.20, "flex"),
    "right_elbow_joint": ("left", 0.20, "flex"),
}
_FEET = ("left_ankle_roll_link", "right_ankle_roll_link")


def _finite_difference_indices(t: int) -> tuple[np.ndarray, np.ndarray]:
    """Central differences inside, one-sided at the ends (as ``np.gradient``)."""
    i = np.arange(t)
    return np.maximum(i - 1, 0), np.minimum(i + 1, t - 1)


def generate_clip(model_path: str | os.PathLike[str] | Any = None, *, seconds: float = 4.0,
                  fps: int = 50, seed: int = 0,
                  body_names: tuple[str, ...] = DEFAULT_TRACKED_BODIES,
                  speed: float = 0.5, gait_hz: float = 1.0) -> MotionClip:
    """A deterministic walking clip of ``seconds`` at ``fps`` (``seconds * fps + 1`` frames).

    Joints: the stand keyframe plus sinusoidal hip and knee pitch with opposite
    phase per leg, ankle pitch keeping the soles level, arms swinging with the opposite
    leg, elbows flexing; ``seed`` picks the
    start phase and a +-10% amplitude scale. Root: identity orientation, moving along
    +x at ``speed`` m/s; its height is the keyframe's, adjusted per frame so that the
    lower ankle stays at its stand-keyframe height (no foot sinks into the floor).
    Body poses come from ``mj_kinematics`` on one plain ``MjData``; velocities from
    finite differences (angular ones from quaternion differences, world frame).
    Same arguments, same clip.
    """
    import mujoco  # only here: importing this module stays light

    if seconds <= 0 or fps <= 0:
        raise ValueError(f"seconds and fps must be > 0, got {seconds} and {fps}")
    from resettrace.sim.model_facts import keyframe_qpos, load_model

    model = load_model(model_path)
    path = "the bundled G1" if model_path is None else str(model_path)
    data = mujoco.MjData(model)
    body_ids = []
    for name in body_names:
        bid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name)
        if bid < 0:
            raise ValueError(f"body {name!r} is not in the model {path}")
        body_ids.append(bid)
    stand = keyframe_qpos(model)

    t_frames = int(round(seconds * fps)) + 1
    if t_frames < 2:
        raise ValueError(f"seconds * fps must give at least 2 frames, got {t_frames}")
    rng = np.random.default_rng(seed)
    phase0 = rng.uniform(0.0, 2.0 * np.pi)
    amp_scale = 1.0 + rng.uniform(-0.1, 0.1)
    time = np.arange(t_frames) / float(fps)
    psi = {"left": 2.0 * np.pi * gait_hz * time + phase0}
    psi["right"] = psi["left"] + np.pi

    qpos = np.tile(stand, (t_frames, 1))
    leg_pitch = {"left": np.zeros(t_frames), "right": np.zeros(t_frames)}
    for joint, (side, amp, shape) in _GAIT.items():  # "flat" entries come after hip and knee
        jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, joint)
        if jid < 0:  # another model: animate the joints it has
            continue
        adr = int(model.jnt_qposadr[jid])
        if shape == "sin":
            delta = amp * amp_scale * np.sin(psi[side])
        elif shape == "flex":
            delta = amp * amp_scale * 0.5 * (1.0 - np.cos(psi[side]))
        else:
            delta = -leg_pitch[side]
        if "hip_pitch" in joint or "knee" in joint:
            leg_pitch[side] = leg_pitch[side] + delta
        lo, hi = model.jnt_range[jid] if model.jnt_limited[jid] else (-np.inf, np.inf)
        qpos[:, adr] = np.clip(stand[adr] + delta, lo, hi)
    qpos[:, 0] = speed * time
    qpos[:, 3:7] = (1.0, 0.0, 0.0, 0.0)

    feet = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, f) for f in _FEET]
    feet = [f for f in feet if f >= 0]
    if feet:  # the root is a pure translation: shifting it shifts every body by the same dz
        data.qpos[:] = stand
        mujoco.mj_kinematics(model, data)
        foot_stand = min(float(data.xpos[f, 2]) for f in feet)
        for i in range(t_frames):
            data.qpos[:] = qpos[i]
            mujoco.mj_kinematics(model, data)
            qpos[i, 2] += foot_stand - min(float(data.xpos[f, 2]) for f in feet)

    nb = len(body_ids)
    body_pos = np.empty((t_frames, nb, 3))
    body_quat = np.empty((t_frames, nb, 4))
    for i in range(t_frames):
        data.qpos[:] = qpos[i]
        mujoco.mj_kinematics(model, data)
        body_pos[i] = data.xpos[body_ids]
        body_quat[i] = data.xquat[body_ids]

    lo_i, hi_i = _finite_difference_indices(t_frames)
    span = ((hi_i - lo_i) / float(fps))[:, None]
    joint_pos = qpos[:, 7:]
    joint_vel = (joint_pos[hi_i] - joint_pos[lo_i]) / span
    body_lin_vel = (body_pos[hi_i] - body_pos[lo_i]) / span[:, :, None]
    dq = qmul(body_quat[hi_i], qconj(body_quat[lo_i]))  # world-frame rotation over the span
    body_ang_vel = qlog(dq) / span[:, :, None]
    joint_names = tuple(mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) or f"joint{j}"
                        for j in range(1, model.njnt))
    return MotionClip(fps=float(fps), joint_pos=joint_pos, joint_vel=joint_vel,
                      body_names=tuple(body_names), body_pos=body_pos, body_quat=body_quat,
                      body_lin_vel=body_lin_vel, body_ang_vel=body_ang_vel,
                      joint_names=joint_names)


# -- start-frame sampling -------------------------------------------------------------------
class MotionSampler:
    """Start frames in ``[0, num_frames)`` for reset rows of ``num_envs`` envs.

    Modes:

    - ``"start"``: always frame 0;
    - ``"uniform"``: every frame equally likely;
    - ``"adaptive"``: frames are grouped into ``B = min(bins, num_frames)`` equal bins
      (frame ``f`` is in bin ``f * B // num_frames``). Each :meth:`record_failures`
      call (once per env step, with the current frames of the envs that failed)
      updates a per-bin failure EMA with ``c_b``, the failures that fell in bin ``b``::

          F_b <- (1 - ema) * F_b + ema * c_b

      and a bin is drawn with probability::

          p_b = (1 - uniform_ratio) * F_b / sum_j F_j + uniform_ratio / B

      (``p_b = 1 / B`` while no failure was recorded), then a frame uniformly inside
      it. ``uniform_ratio`` keeps every part of the clip in play.
    """

    MODES: tuple[str, ...] = ("adaptive", "uniform", "start")

    def __init__(self, num_frames: int, num_envs: int, mode: str = "adaptive", *,
                 bins: int = 20, ema: float = 0.01, uniform_ratio: float = 0.1,
                 rng: np.random.Generator | None = None) -> None:
        if mode not in self.MODES:
            raise ValueError(f"unknown sampler mode {mode!r}; modes: {', '.join(self.MODES)}")
        if int(num_frames) < 1 or int(num_envs) < 1:
            raise ValueError(f"num_frames and num_envs must be >= 1, got {num_frames} and "
                             f"{num_envs}")
        if int(bins) < 1:
            raise ValueError(f"bins must be >= 1, got {bins}")
        if not 0.0 < ema <= 1.0:
            raise ValueError(f"ema must be in (0, 1], got {ema}")
        if not 0.0 <= uniform_ratio <= 1.0:
            raise ValueError(f"uniform_ratio must be in [0, 1], got {uniform_ratio}")
        self.mode = mode
        self.num_frames = int(num_frames)
        self.num_envs = int(num_envs)
        self.num_bins = min(int(bins), self.num_frames)
        self.ema = float(ema)
        self.uniform_ratio = float(uniform_ratio)
        self.rng = rng if rng is not None else np.random.default_rng(0)
        #: per-bin failure EMA (failures per record_failures call)
        self.bin_failures = np.zeros(self.num_bins)
        b = np.arange(self.num_bins + 1)
        #: first frame of each bin, then num_frames: bin b = [edges[b], edges[b + 1])
        self.bin_edges = (b * self.num_frames + self.num_bins - 1) // self.num_bins
        self._uniform = np.full(self.num_bins, 1.0 / self.num_bins)

    def bin_of(self, frames: np.ndarray) -> np.ndarray:
        return np.asarray(frames, dtype=np.int64) * self.num_bins // self.num_frames

    @property
    def probabilities(self) -> np.ndarray:
        """The bin probabilities ``p_b`` of the adaptive mode (uniform before failures)."""
        total = self.bin_failures.sum()
        if total <= 0.0:
            return self._uniform.copy()
        u = self.uniform_ratio
        return (1.0 - u) * self.bin_failures / total + u / self.num_bins

    def sample(self, env_ids: np.ndarray, rng: np.random.Generator | None = None
               ) -> np.ndarray:
        """Start frames ``(len(env_ids),)`` int64 for the rows ``env_ids``."""
        ids = np.asarray(env_ids)
        k = ids.size
        if k and (ids.min() < 0 or ids.max() >= self.num_envs):
            raise ValueError(f"env ids must be in [0, {self.num_envs})")
        g = self.rng if rng is None else rng
        if self.mode == "start":
            return np.zeros(k, dtype=np.int64)
        if self.mode == "uniform":
            return g.integers(0, self.num_frames, k, dtype=np.int64)
        cdf = np.cumsum(self.probabilities)
        bins = np.minimum(np.searchsorted(cdf, g.random(k) * cdf[-1], side="right"),
                          self.num_bins - 1)
        lo = self.bin_edges[bins]
        width = self.bin_edges[bins + 1] - lo
        return lo + (g.random(k) * width).astype(np.int64)

    def record_failures(self, frames: np.ndarray) -> None:
        """One EMA update with the frames at which envs failed this step (may be empty);
        frames ``>= num_frames`` count for the last bin."""
        f = np.asarray(frames, dtype=np.int64).ravel()
        if f.size and f.min() < 0:
            raise ValueError(f"failure frames must be >= 0, got {int(f.min())}")
        # frames past the last start frame (the clip's last frame) count for the last bin
        counts = np.bincount(np.minimum(self.bin_of(f), self.num_bins - 1),
                             minlength=self.num_bins)
        self.bin_failures *= 1.0 - self.ema
        self.bin_failures += self.ema * counts

    def reset_statistics(self) -> None:
        self.bin_failures[:] = 0.0
