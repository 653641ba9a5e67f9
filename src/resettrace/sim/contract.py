"""The backend contract: what every simulator backend provides to envs and tasks.

Layout at this boundary is MuJoCo's for every backend: ``qpos`` is the floating
base position (xyz), its orientation as a unit quaternion (**wxyz**), then the
hinge joint positions; ``qvel`` is the base linear velocity (world frame), angular
velocity (local frame), then the joint velocities. Body poses are ``(k, bodies, 7)``
arrays of xyz + wxyz.

``set_state(env_ids, qpos, qvel, randomization=None)`` re-initialises the rows
``env_ids`` (sorted or not, unique, in range) to the given state and holds their
actuators at the new joint positions, touching no other row. Their kinematics (body
poses) are up to date wherever they are read through ``get_body_pose_rows``: a backend may
compute them inside ``set_state`` (eager) or mark the rows stale and compute them at that
read, or not at all when a physics step comes first (lazy, the shipped backends' default;
``lazy_kinematics = False`` makes them eager). It validates every input before any
engine call and raises ``ValueError`` naming the problem. With tracing on it returns
``{"timing": {key: ms}}`` with the keys of ``CATALOG.timing_keys(SET_STATE)``: the
16 :data:`~resettrace.catalog.SET_STATE_KEYS`, a key per registered child of
``set_state`` before the gap (0.0 where a phase does not apply; the gap closes the
account); with tracing off it returns ``None``.

This module imports no backend: each backend module ends with a ``TYPE_CHECKING`` block
assigning its class to ``type[SimBackend]``, so a type checker proves that backend
satisfies the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["SimBackend", "SetStateResult", "BackendInfo"]

IdsLike = npt.ArrayLike


class SetStateResult(TypedDict):
    """What ``set_state`` returns when tracing is on."""

    timing: dict[str, float]


#: the most envs one backend batch takes (the engines index envs with int32)
MAX_ENVS = 2**31 - 1


@dataclass(frozen=True, kw_only=True)
class BackendInfo:
    """Static facts about a backend's model, shared by envs and tasks."""

    name: str
    joint_names: tuple[str, ...]  # hinge joints, in qpos order after the free joint
    body_names: tuple[str, ...]
    actuator_names: tuple[str, ...]
    joint_range: np.ndarray  # (n_joints, 2)
    ctrl_range: np.ndarray  # (nu, 2)
    actuator_joint: np.ndarray  # (nu,) index into the hinge joints each actuator drives
    physics_dt: float
    #: the MJCF file the backend loaded (None: the bundled G1, or a model given in memory)
    model_path: str | None = None


@runtime_checkable
class SimBackend(Protocol):
    """A batch of ``num_envs`` simulations of one model."""

    name: str
    num_envs: int
    nq: int
    nv: int
    nu: int
    info: BackendInfo
    #: where the backend's set_state phases are recorded (the no-op recorder when off)
    recorder: Any

    @property
    def keyframe_qpos(self) -> np.ndarray:
        """The ``stand`` keyframe qpos, shape ``(nq,)``, contract layout."""
        ...

    def step(self, ctrl: np.ndarray, nsteps: int = 1) -> None:
        """Set every env's actuator targets ``(num_envs, nu)`` and advance ``nsteps`` substeps."""
        ...

    def set_state(self, env_ids: IdsLike, qpos: np.ndarray, qvel: np.ndarray,
                  randomization: Any = None) -> SetStateResult | None: ...

    def get_qpos_rows(self, env_ids: IdsLike | None = None) -> np.ndarray:
        """``(k, nq)`` qpos of the rows (all rows for ``None``), contract layout."""
        ...

    def get_qvel_rows(self, env_ids: IdsLike | None = None) -> np.ndarray: ...

    def get_body_pose_rows(self, env_ids: IdsLike | None,
                           body_names: tuple[str, ...] | list[str]) -> np.ndarray:
        """``(k, len(body_names), 7)`` xyz + wxyz world poses of those bodies."""
        ...

    def close(self) -> None: ...
