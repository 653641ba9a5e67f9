"""``resettrace bench stacks``: what each shipped instrumentation costs a training step.

For each stack, one env in one process: MotrixLab, the arm ``ManagerEnv`` of
:mod:`resettrace.bench.stack_envs.motrixlab_arm`; Gymnasium, ``Hopper-v5`` in a sync
vector env (with random actions a hopper falls within tens of steps: resets happen at
their own pace in each sub-env, as in training); mjlab (``--stack mjlab``, in a venv with
the ``mjlab`` extra: mjlab pins MuJoCo 3.11), a task of mjlab's own on Warp's CPU device
(``Mjlab-Cartpole-Balance`` by default, 1 s episodes: its envs time out and reset every 20
steps of 50 ms). Rounds visit the modes in a fresh
random order and time a block of env steps in each (random actions drawn beforehand),
after a few untimed steps in that mode (``settle``: switching modes re-installs patches
and brings the other session's state back into the caches, a cost a run that stays in one
mode never pays). A block lasts about ``block_ms`` (100 ms: 10 MotrixLab steps, ~70
Gymnasium ones), its steps worked out from the ``off`` mode's warm-up steps, unless
``block`` gives them: blocks of one length in time average the machine's short stalls
and the resets' spread alike in both stacks (10-step Gymnasium blocks, 15 ms, varied
5.5% block to block, and their ratios +-0.5% run to run):

- ``bare``: the instrumentation not installed (installed and undone between blocks);
- ``off`` and ``off_aa``: installed, tracing off (the A/A twin: two blocks of one mode);
- ``timing``: installed, ``RESETTRACE=timing`` (a session of its own, bound for the block).

Ratios timing/off, off/bare and off_aa/off (the noise), of the per-step medians and of
the modes' total times (what a run pays: a cost that comes once in many blocks, as the
aggregation thread draining its queue, is in the total and may miss the median), each
with a 95% paired bootstrap interval over the rounds, are measured side by side in one
run, so machine noise hits every mode alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from resettrace import catalog as C
from resettrace.bench._stats import paired_ratio_ci
from resettrace.config import Config
from resettrace.tables import format_table

__all__ = ["StacksBenchConfig", "run_stacks_bench", "render_stacks_bench", "STACKS"]

MODES = ("bare", "off", "off_aa", "timing")
RATIOS = (("timing", "off"), ("off", "bare"), ("off_aa", "off"))
STACKS = ("motrixlab", "gymnasium", "mjlab")
#: what ``bench stacks`` measures when not told (mjlab needs a venv of its own)
DEFAULT_STACKS = ("motrixlab", "gymnasium")
#: the extra each stack's env needs
STACK_EXTRA = {"motrixlab": "sim", "gymnasium": "sim", "mjlab": "mjlab"}


@dataclass(frozen=True, kw_only=True)
class StacksBenchConfig:
    stacks: tuple[str, ...] = DEFAULT_STACKS
    #: envs of the MotrixLab env (one batched env)
    motrixlab_envs: int = 1024
    #: sub-envs of the Gymnasium sync vector env
    gymnasium_envs: int = 16
    #: envs of the mjlab env, its task, and its episodes' length (s; None: the task's)
    mjlab_envs: int = 64
    mjlab_task: str = "Mjlab-Cartpole-Balance"
    mjlab_episode_s: float | None = 1.0
    rounds: int = 40
    #: env steps per timed block (None: as many as take ``block_ms``)
    block: int | None = None
    #: the length of a timed block, when ``block`` is None
    block_ms: float = 100.0
    #: untimed steps per mode first
    warmup: int = 10
    #: untimed steps before each timed block, in its mode: what switching modes costs
    #: once (patched functions new, the other session's state in the caches) is no
    #: mode's cost
    settle: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [s for s in self.stacks if s not in STACKS]
        if unknown or not self.stacks:
            raise ValueError(f"--stack must be among {', '.join(STACKS)}, got "
                             f"{', '.join(unknown) or 'none'}")
        if self.mjlab_episode_s is not None and not self.mjlab_episode_s > 0:
            raise ValueError(f"--mjlab-episode-s must be > 0, got {self.mjlab_episode_s}")
        for name in ("motrixlab_envs", "gymnasium_envs", "mjlab_envs", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got "
                                 f"{getattr(self, name)}")
        if self.rounds < 3:
            raise ValueError(f"--rounds must be >= 3 (a paired interval), got {self.rounds}")
        if self.block is not None and self.block < 1:
            raise ValueError(f"--block must be >= 1, got {self.block}")
        if not self.block_ms > 0:
            raise ValueError(f"--block-ms must be > 0, got {self.block_ms}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        if self.block is None and self.warmup < 1:
            raise ValueError("--warmup must be >= 1 when --block-ms sizes the blocks "
                             "(the warm-up steps time a step), or give --block")
        if self.settle < 0:
            raise ValueError(f"--settle must be >= 0, got {self.settle}")


def _motrixlab(cfg: StacksBenchConfig) -> tuple[Callable[[int], None], Callable[[], None], str]:
    from resettrace.bench.stack_envs import motrixlab_arm

    env = motrixlab_arm.make_env(cfg.motrixlab_envs, seed=cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    dim = env.action_space.shape[-1]
    actions = [rng.standard_normal((cfg.motrixlab_envs, dim)).astype(np.float32)
               for _ in range(32)]

    def step(i: int) -> None:
        env.step(actions[i % len(actions)])

    return step, lambda: None, f"MotrixLab arm ManagerEnv, {cfg.motrixlab_envs} envs"


def _gymnasium(cfg: StacksBenchConfig) -> tuple[Callable[[int], None], Callable[[], None], str]:
    import gymnasium as gym

    envs = gym.make_vec("Hopper-v5", num_envs=cfg.gymnasium_envs, vectorization_mode="sync")
    envs.reset(seed=cfg.seed)
    envs.action_space.seed(cfg.seed)
    actions = [envs.action_space.sample() for _ in range(64)]

    def step(i: int) -> None:
        envs.step(actions[i % len(actions)])

    return step, envs.close, f"Gymnasium Hopper-v5, sync vector env of {cfg.gymnasium_envs}"


def _mjlab(cfg: StacksBenchConfig) -> tuple[Callable[[int], None], Callable[[], None], str]:
    import mjlab.tasks  # noqa: F401  (registers the tasks)
    import torch
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.tasks.registry import list_tasks, load_env_cfg

    if cfg.mjlab_task not in list_tasks():
        raise ValueError(f"--mjlab-task {cfg.mjlab_task!r} is not one of mjlab's tasks "
                         f"({', '.join(list_tasks())})")
    env_cfg = load_env_cfg(cfg.mjlab_task)
    env_cfg.scene.num_envs = cfg.mjlab_envs
    if cfg.mjlab_episode_s is not None:
        env_cfg.episode_length_s = cfg.mjlab_episode_s
    env = ManagerBasedRlEnv(env_cfg, device="cpu")
    env.reset(seed=cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    dim = env.action_manager.total_action_dim
    actions = [torch.rand((cfg.mjlab_envs, dim), generator=gen) * 2 - 1 for _ in range(32)]

    def step(i: int) -> None:
        env.step(actions[i % len(actions)])

    return step, env.close, f"mjlab {cfg.mjlab_task}, {cfg.mjlab_envs} envs (Warp, CPU)"


_ENVS = {"motrixlab": _motrixlab, "gymnasium": _gymnasium, "mjlab": _mjlab}


def _one_stack(name: str, cfg: StacksBenchConfig, progress: Callable[[str], None]
               ) -> dict[str, Any]:
    import resettrace
    from resettrace.tracing.session import Tracing

    sessions = {"off": Tracing(Config(mode="off")), "timing": Tracing(Config(mode="timing"))}
    sessions["off_aa"] = sessions["bare"] = sessions["off"]
    undo: Callable[[], None] | None = resettrace.instrument(name)
    try:
        with resettrace.use_tracing(sessions["off"]):
            step, close, what = _ENVS[name](cfg)
        rng = np.random.default_rng(cfg.seed)
        times: dict[str, list[float]] = {m: [] for m in MODES}
        block = cfg.block or 0
        i = 0
        for r in range(-1, cfg.rounds):
            for mode in rng.permutation(MODES):
                if mode == "bare" and undo is not None:
                    undo()
                    undo = None
                elif mode != "bare" and undo is None:
                    undo = resettrace.instrument(name)
                with resettrace.use_tracing(sessions[mode]):
                    for _ in range(cfg.settle):
                        step(i)
                        i += 1
                    if r < 0:  # warm-up: each step timed, to size the blocks
                        each = []
                        for _ in range(cfg.warmup):
                            t0 = time.perf_counter_ns()
                            step(i)
                            each.append(time.perf_counter_ns() - t0)
                            i += 1
                        if mode == "off" and not block:
                            block = max(1, round(cfg.block_ms * 1e6 / statistics.median(each)))
                        continue
                    t0 = time.perf_counter_ns()
                    for _ in range(block):
                        step(i)
                        i += 1
                    t1 = time.perf_counter_ns()
                times[mode].append((t1 - t0) / block / 1e3)
            if r >= 0 and (r + 1) % max(1, cfg.rounds // 5) == 0:
                progress(f"{name}: round {r + 1}/{cfg.rounds}")
        close()
    finally:
        if undo is not None:
            undo()
    stats = sessions["timing"].stats()
    for s in {id(v): v for v in sessions.values()}.values():
        s.shutdown()
    med = {m: statistics.median(v) for m, v in times.items()}
    ratios = {}
    for a, b in RATIOS:
        ratios[f"{a}/{b}"] = {"ratio": med[a] / med[b],
                              "ci95": paired_ratio_ci(times[a], times[b]),
                              "total_ratio": sum(times[a]) / sum(times[b]),
                              "total_ci95": paired_ratio_ci(times[a], times[b], np.sum)}
    steps = stats.get(C.ENV_STEP.key)
    resets = stats.get(C.RESET_DONE_COUNT)
    return {"stack": name, "env": what, "block": block, "us_per_step": med, "ratios": ratios,
            "timing_steps": steps.count if steps else 0,
            "timing_resets": int(resets.total_ms) if resets else 0,
            "samples_us": times}


def run_stacks_bench(cfg: StacksBenchConfig, progress: Callable[[str], None] | None = None
                     ) -> dict[str, Any]:
    from resettrace.tracing.recorder import COMPILED

    say = progress or (lambda _m: None)
    return {"config": asdict(cfg), "compiled": COMPILED,
            "stacks": [_one_stack(name, cfg, say) for name in cfg.stacks]}


def render_stacks_bench(result: dict[str, Any]) -> str:
    rows = []
    for s in result["stacks"]:
        us = s["us_per_step"]
        for key, r in s["ratios"].items():
            ci, tci = r["ci95"], r["total_ci95"]
            rows.append([s["stack"], key, f"{r['ratio']:.4f}",
                         f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "-",
                         f"{r['total_ratio']:.4f}",
                         f"[{tci[0]:.4f}, {tci[1]:.4f}]" if tci else "-",
                         " / ".join(f"{us[m]:.1f}" for m in key.split("/"))])
    out = [format_table("env step with each shipped instrumentation",
                        ["stack", "ratio", "median", "95% CI (paired)", "total",
                         "95% CI (paired)", "median us per step"], rows)]
    for s in result["stacks"]:
        out.append(f"{s['stack']}: {s['env']}; blocks of {s['block']} steps; timing mode "
                   f"recorded {s['timing_steps']} env steps and {s['timing_resets']} env "
                   "resets")
    out.append("the recorder's hot path: " + ("compiled" if result.get("compiled") else
                                               "Python (RESETTRACE_PURE_PYTHON=1, or not built)"))
    out.append("timing/off is the instrumentation's cost with RESETTRACE=timing; off/bare "
               "its cost installed with tracing off; off_aa/off two blocks of one mode "
               "(the noise of this run); median: of the per-step medians, total: of all the "
               "blocks' time together (what a run pays, rare costs included)")
    return "\n".join(out)
