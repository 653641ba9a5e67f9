"""Domain randomization reaches the engine for the reset rows only, under its phases."""

from __future__ import annotations

import numpy as np
import pytest

import resettrace
from helpers import stand_rows
from resettrace import catalog as C
from resettrace.sim.randomization import (
    RandomizationConfig,
    RandomizationPayload,
    RandomizationRows,
)


def _rows(k: int, rng: np.random.Generator) -> RandomizationRows:
    return RandomizationRows(friction=rng.uniform(0.3, 1.5, k),
                             mass_scale=rng.uniform(0.8, 1.2, k),
                             kp_scale=rng.uniform(0.7, 1.3, k), kd_scale=rng.uniform(0.7, 1.3, k),
                             geom_size_scale=rng.uniform(0.9, 1.1, k))


def test_mujoco_applies_every_quantity_to_the_reset_rows_only(timing_session) -> None:
    b = resettrace.make_backend("mujoco", num_envs=8, tracing=timing_session, nthread=1)
    m, batch = b.model, b.batch
    contact = np.flatnonzero(((m.geom_contype | m.geom_conaffinity) != 0) & (m.geom_bodyid != 0))
    rng = np.random.default_rng(0)
    ids = np.array([6, 1, 4])  # unsorted on purpose: rows follow their ids
    rows = _rows(3, rng)
    q, v = stand_rows(b, 3)
    timing = b.set_state(ids, q, v, rows)["timing"]
    assert timing["set_state_reset_rand_ms"] > 0 and timing["set_state_geom_overrides_ms"] > 0
    friction = batch.expanded("geom_friction")
    for i, env in enumerate(ids):
        np.testing.assert_allclose(friction[env, contact, 0], rows.friction[i])
        np.testing.assert_allclose(batch.expanded("body_mass")[env],
                                   m.body_mass * rows.mass_scale[i])
        np.testing.assert_allclose(batch.expanded("actuator_gainprm")[env, :, 0],
                                   m.actuator_gainprm[:, 0] * rows.kp_scale[i])
        np.testing.assert_allclose(batch.expanded("actuator_biasprm")[env, :, 1],
                                   m.actuator_biasprm[:, 1] * rows.kp_scale[i])
        np.testing.assert_allclose(batch.expanded("actuator_biasprm")[env, :, 2],
                                   m.actuator_biasprm[:, 2] * rows.kd_scale[i])
        np.testing.assert_allclose(batch.expanded("geom_size")[env, contact],
                                   m.geom_size[contact] * rows.geom_size_scale[i])
        # derived constants follow the mass: the model the engine runs on has them
        assert batch.get_model(int(env)).body_subtreemass[0] == pytest.approx(
            m.body_subtreemass[0] * rows.mass_scale[i])
    for env in (0, 2, 3, 5, 7):  # untouched rows keep the model's own values
        np.testing.assert_array_equal(friction[env], m.geom_friction)
        np.testing.assert_array_equal(batch.expanded("body_mass")[env], m.body_mass)
        np.testing.assert_array_equal(batch.expanded("geom_size")[env], m.geom_size)
    b.close()


def test_motrix_applies_every_quantity_to_the_reset_rows_only(timing_session) -> None:
    b = resettrace.make_backend("motrix", num_envs=8, tracing=timing_session, nthread=1)
    rng = np.random.default_rng(1)
    ids = np.array([6, 1, 4])
    rows = _rows(3, rng)
    q, v = stand_rows(b, 3)
    timing = b.set_state(ids, q, v, rows)["timing"]
    assert timing["set_state_reset_rand_ms"] > 0 and timing["set_state_geom_overrides_ms"] > 0
    base = b._overrides()
    data, untouched = b.data, [0, 2, 3, 5, 7]
    assert len(base["sized"]) == len(base["geoms"]) > 0  # the G1's are all primitives
    for geom, f0 in base["geoms"]:
        friction = geom.get_friction_override(data)
        np.testing.assert_allclose(friction[ids, 0], rows.friction, rtol=1e-6)
        np.testing.assert_allclose(friction[untouched], np.tile(f0, (5, 1)), rtol=1e-6)
    for geom, s0 in base["sized"]:
        size = geom.get_size_override(data)
        np.testing.assert_allclose(size[ids], s0[None, :] * rows.geom_size_scale[:, None],
                                   rtol=1e-6)
        np.testing.assert_allclose(size[untouched], np.tile(s0, (5, 1)), rtol=1e-6)
    for link, m0, _ in base["links"]:
        mass = link.get_mass_override(data)
        np.testing.assert_allclose(mass[ids], m0 * rows.mass_scale, rtol=1e-6)
        np.testing.assert_allclose(mass[untouched], m0, rtol=1e-6)
    for act, kp0, kd0 in base["actuators"]:
        np.testing.assert_allclose(act.get_kp_override(data)[ids], kp0 * rows.kp_scale,
                                   rtol=1e-6)
        np.testing.assert_allclose(act.get_kp_override(data)[untouched], kp0, rtol=1e-6)
        np.testing.assert_allclose(act.get_kd_override(data)[ids], kd0 * rows.kd_scale,
                                   rtol=1e-6)
    b.step(np.tile(b.keyframe_qpos[7:], (8, 1)), 3)  # the engine steps on the overrides
    assert np.isfinite(b.get_qpos_rows(None)).all()
    b.close()


@pytest.mark.parametrize("backend", ["mujoco", "motrix"])
def test_randomized_env_runs_on_both_backends(backend, timing_session) -> None:
    env = resettrace.make_env("g1_walk_flat", backend=backend, num_envs=8, seed=4,
                              tracing=timing_session, randomization=True, nthread=1)
    mask = np.zeros(8, bool)
    mask[[2, 5]] = True
    env.reset_done(mask)
    for _ in range(3):
        obs, _, _, _ = env.step(np.zeros((8, env.action_dim)))
    assert np.isfinite(obs).all()
    st = timing_session.stats()
    assert st["set_state_reset_rand_ms"].max_ms > 0
    assert st["set_state_geom_overrides_ms"].max_ms > 0
    env.close()


@pytest.mark.parametrize("bad,match", [
    (RandomizationRows(friction=np.ones(2)), "friction must have shape \\(3,\\)"),
    (RandomizationRows(mass_scale=np.array([1.0, np.nan, 1.0])), "finite and > 0"),
    (RandomizationRows(kp_scale=np.array([1.0, 0.0, 1.0])), "finite and > 0"),
    ({"friction": 1.0}, "RandomizationRows"),
])
def test_bad_randomization_raises_before_any_engine_call(bad, match) -> None:
    b = resettrace.make_backend("mujoco", num_envs=4, nthread=1)
    q, v = stand_rows(b, 3)
    before = np.array(b.get_qpos_rows(None))
    with pytest.raises(ValueError, match=match):
        b.set_state([0, 1, 2], q, v, bad)
    np.testing.assert_array_equal(b.get_qpos_rows(None), before)
    assert b.batch.expanded("geom_friction") is None  # nothing was expanded either
    b.close()


def test_config_and_payload() -> None:
    with pytest.raises(ValueError, match="friction must be a range"):
        RandomizationConfig(friction=(1.0, 0.5))
    cfg = RandomizationConfig(friction=(0.5, 0.6), geom_size_scale=None)
    p = RandomizationPayload(cfg, 10, np.random.default_rng(0))
    assert set(p.values) == {"friction", "mass_scale", "kp_scale", "kd_scale"}
    assert ((p.values["friction"] >= 0.5) & (p.values["friction"] <= 0.6)).all()
    before = p.values["friction"].copy()
    p.resample(np.array([2, 3]), np.random.default_rng(1))
    changed = np.flatnonzero(p.values["friction"] != before)
    assert set(changed) == {2, 3}
    rows = p.rows(np.array([3, 2]))
    assert rows.geom_size_scale is None and rows.friction[0] == p.values["friction"][3]


def test_env_resets_draw_new_models_for_the_reset_rows(timing_session) -> None:
    env = resettrace.make_env("g1_walk_flat", num_envs=16, tracing=timing_session, seed=2,
                              randomization=True, nthread=1)
    payload = env.dr.payload
    friction = env.backend.batch.expanded("geom_friction")
    contact = env.backend._contact_geoms
    np.testing.assert_allclose(friction[:, contact[0], 0], payload.values["friction"])
    before = payload.values["friction"].copy()
    mask = np.zeros(16, bool)
    mask[[3, 9]] = True
    env.reset_done(mask)
    changed = np.flatnonzero(payload.values["friction"] != before)
    assert set(changed) == {3, 9}
    np.testing.assert_allclose(friction[:, contact[0], 0], payload.values["friction"])
    st = timing_session.stats()
    assert st["set_state_reset_rand_ms"].max_ms > 0
    assert st["set_state_geom_overrides_ms"].max_ms > 0
    assert st[C.DR_RESET_PAYLOAD_FILTER.key].count == 1
    for _ in range(3):  # the engine steps on the randomized models
        obs, _, _, _ = env.step(np.zeros((16, env.action_dim)))
    assert np.isfinite(obs).all()
    env.close()
