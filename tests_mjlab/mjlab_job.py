"""A small mjlab training loop on the CPU (Warp's CPU device): the cartpole task with short
episodes, so envs reset every few steps. Writes what happened (steps, the envs reset, the
decimation) as JSON to the path given, for the tests to hold the trace's counts against."""

from __future__ import annotations

import json
import sys

import mjlab.tasks  # noqa: F401  (registers the tasks)
import torch
from mjlab.envs import ManagerBasedRlEnv
from mjlab.tasks.registry import load_env_cfg


def main(out: str, num_envs: int, steps: int) -> None:
    cfg = load_env_cfg("Mjlab-Cartpole-Balance")
    cfg.scene.num_envs = num_envs
    cfg.episode_length_s = 0.4  # a time-out every few steps
    env = ManagerBasedRlEnv(cfg, device="cpu")
    env.reset()  # every env: a reset outside a step
    resets, reset_calls = num_envs, 1
    actions = torch.zeros((num_envs, env.action_manager.total_action_dim))
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(actions)
        done = int((terminated | truncated).sum())
        resets += done
        reset_calls += done > 0
    env.reset(env_ids=torch.tensor([1, 3]))  # a partial reset outside a step
    resets += 2
    reset_calls += 1
    env.close()
    with open(out, "w") as f:
        json.dump({"steps": steps, "resets": resets, "reset_calls": reset_calls,
                   "num_envs": num_envs, "decimation": cfg.decimation}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
