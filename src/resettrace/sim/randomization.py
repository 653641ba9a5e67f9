"""Domain randomization applied on reset: per-env friction, mass, PD gains, geom sizes.

:class:`RandomizationConfig` names the ranges (``None`` leaves a quantity alone).
:class:`RandomizationPayload` holds one value per env and quantity; the DR manager
resamples the reset rows in its plan phase and hands their rows
(:class:`RandomizationRows`, ``payload.rows(env_ids)``) to
``backend.set_state(..., randomization=rows)``, which applies them to those rows only:

===================  =============================================  ==================
quantity             applied to                                     set_state phase
===================  =============================================  ==================
``friction``         sliding friction of the contact geoms          ``reset_rand``
``mass_scale``       every body's mass and inertia                  ``reset_rand``
``kp_scale``         position actuators' stiffness                  ``reset_rand``
``kd_scale``         position actuators' damping                    ``reset_rand``
``geom_size_scale``  size of the contact geoms (feet)               ``geom_overrides``
===================  =============================================  ==================

Scales multiply the model's own values, so a scale of 1 is the unrandomized model.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

__all__ = ["RandomizationConfig", "RandomizationPayload", "RandomizationRows", "QUANTITIES",
           "as_rows", "reorder_rows"]

QUANTITIES = ("friction", "mass_scale", "kp_scale", "kd_scale", "geom_size_scale")
Range = tuple[float, float] | None


@dataclass(frozen=True, kw_only=True)
class RandomizationConfig:
    """Uniform ranges ``(low, high)`` per quantity; ``None`` disables one."""

    #: sliding friction coefficient of the contact geoms
    friction: Range = (0.4, 1.2)
    #: factor on every body's mass and inertia
    mass_scale: Range = (0.9, 1.1)
    #: factor on the position actuators' kp
    kp_scale: Range = (0.85, 1.15)
    #: factor on the position actuators' kd
    kd_scale: Range = (0.85, 1.15)
    #: factor on the contact geoms' size
    geom_size_scale: Range = (0.95, 1.05)

    def __post_init__(self) -> None:
        for f in fields(self):
            r = getattr(self, f.name)
            if r is None:
                continue
            lo, hi = r
            if not (np.isfinite(lo) and np.isfinite(hi) and 0.0 < lo <= hi):
                raise ValueError(f"{f.name} must be a range 0 < low <= high, got {r!r}")


@dataclass(frozen=True)
class RandomizationRows:
    """The values of k reset rows (``None``: leave that quantity as it is)."""

    friction: np.ndarray | None = None
    mass_scale: np.ndarray | None = None
    kp_scale: np.ndarray | None = None
    kd_scale: np.ndarray | None = None
    geom_size_scale: np.ndarray | None = None

    def validate(self, k: int) -> None:
        """Shapes ``(k,)``, finite and positive, or ``ValueError`` naming the quantity."""
        for name in QUANTITIES:
            v = getattr(self, name)
            if v is None:
                continue
            a = np.asarray(v)
            if a.shape != (k,):
                raise ValueError(f"randomization {name} must have shape ({k},), got {a.shape}")
            if not (np.isfinite(a).all() and (a > 0).all()):
                raise ValueError(f"randomization {name} must be finite and > 0")

    def get(self, name: str) -> np.ndarray | None:
        v = getattr(self, name)
        return None if v is None else np.asarray(v, dtype=np.float64)

    @property
    def empty(self) -> bool:
        return all(getattr(self, n) is None for n in QUANTITIES)


class RandomizationPayload:
    """One value per env and randomized quantity."""

    def __init__(self, config: RandomizationConfig, num_envs: int,
                 rng: np.random.Generator) -> None:
        self.config = config
        self.values: dict[str, np.ndarray] = {
            name: np.ones(num_envs) for name in QUANTITIES if getattr(config, name) is not None}
        self.resample(np.arange(num_envs), rng)

    def resample(self, env_ids: np.ndarray, rng: np.random.Generator) -> None:
        """New values for the rows ``env_ids`` (the next episode's model)."""
        for name, arr in self.values.items():
            lo, hi = getattr(self.config, name)
            arr[env_ids] = rng.uniform(lo, hi, len(env_ids))

    def rows(self, env_ids: np.ndarray) -> RandomizationRows:
        return RandomizationRows(**{name: arr[env_ids] for name, arr in self.values.items()})


def reorder_rows(rows: RandomizationRows, order: np.ndarray) -> RandomizationRows:
    """The rows permuted by ``order`` (a backend sorts its ids; the rows follow)."""
    return RandomizationRows(**{n: None if (v := rows.get(n)) is None else v[order]
                                for n in QUANTITIES})


def as_rows(randomization: object) -> RandomizationRows | None:
    """``randomization`` if it is ``None`` or :class:`RandomizationRows`, else ``ValueError``."""
    if randomization is None or isinstance(randomization, RandomizationRows):
        return randomization
    raise ValueError("randomization must be a resettrace.sim.randomization.RandomizationRows, "
                     f"got {type(randomization).__name__}")
