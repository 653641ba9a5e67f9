"""An unmodified training loop: random actions on 64 cart-poles."""

import numpy as np

from mylab.env import CartPoleEnv

env = CartPoleEnv(num_envs=64)
rng = np.random.default_rng(1)
resets = 0
for _ in range(200):
    _, done = env.step(rng.uniform(-1, 1, env.num_envs))
    resets += int(done.sum())
print(f"200 steps of {env.num_envs} envs, {resets} resets")
