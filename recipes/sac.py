"""Online SAC on Pendulum-v1 with torchrl's collector and loss over a torchstore replay ring.

    python recipes/sac.py                                       # 8k frames, a few CPU minutes
    python recipes/sac.py sampler=prioritized sampler.ere=true  # prioritized + ERE
    python recipes/sac.py collector.total_frames=400 collector.init_random_frames=200 \\
        eval.episodes=1                                         # smoke
    python recipes/sac.py envs=4 window=8                       # 4 envs, length-8 windows

Pieces: ``torchrl.collectors.Collector`` (torchrl 0.14's name for ``SyncDataCollector``)
over ``torchrl.envs.GymEnv``; ``torchrl.objectives.SACLoss``; the replay buffer is torchrl's
``TensorDictReplayBuffer`` with torchstore's ``StoreReplay`` storage and a torchstore sampler
(``UniformSampler``, or ``PrioritizedSampler`` fed the loss's ``td_error``).

Several envs (``envs=N``): the collector steps a torchrl ``SerialEnv`` of N copies and hands
over ``[N, T]`` batches, which go as they are into ``StoreReplay(capacity, ndim=2)``: each
env's steps stay one contiguous stream with its own episode index. ``window=L`` samples
length-L windows inside episodes (``SequenceWindowSampler``; they never cross an env
stream) instead of single transitions.

Outputs (``outputs/sac/<time>/``, printed at the start and the end): ``config.yaml``,
``metrics.csv``, ``loss.png``, ``policy.safetensors`` (the actor) and ``sac.log``.
``python recipes/rollout.py outputs/sac/<time>`` rolls the saved actor out again.
"""

from __future__ import annotations

import math
import sys

import hydra
import torch
from _common import make_sampler, recipe_run, strip
from hydra.utils import instantiate
from omegaconf import DictConfig
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.data import TensorDictReplayBuffer
from torchrl.envs import SerialEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import SoftUpdate
from tqdm import tqdm

from torchstore import PrioritizedSampler, SequenceWindowSampler
from torchstore.io.console import bar_width

EVAL_SEED_OFFSET = 10_000  # the evaluation environment's seed: cfg.seed + this

KEEP = (
    "observation",
    "action",
    "done",
    "terminated",
    "truncated",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
    ("next", "truncated"),
)


def make_actor(cfg: DictConfig, env) -> ProbabilisticActor:
    obs_dim = env.observation_spec["observation"].shape[-1]
    act_dim = env.action_spec.shape[-1]
    net = torch.nn.Sequential(
        instantiate(cfg.model.actor, in_features=obs_dim, out_features=2 * act_dim),
        NormalParamExtractor(),
    )
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
    return ProbabilisticActor(
        module,
        in_keys=["loc", "scale"],
        spec=env.action_spec,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": env.action_spec.space.low, "high": env.action_spec.space.high},
        return_log_prob=False,
        default_interaction_type=ExplorationType.RANDOM,
    )


def make_critic(cfg: DictConfig, env) -> ValueOperator:
    obs_dim = env.observation_spec["observation"].shape[-1]
    act_dim = env.action_spec.shape[-1]
    net = instantiate(cfg.model.critic, in_features=obs_dim + act_dim, out_features=1)
    return ValueOperator(net, in_keys=["observation", "action"])


def evaluate_policy(env, actor, episodes: int, max_steps: int, check=None) -> float:
    """Mean return of the deterministic (mode) policy over ``episodes`` rollouts.

    ``check`` is called before each episode (a recipe run's interrupt check).
    """
    returns = []
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(episodes):
            if check is not None:
                check()
            rollout = env.rollout(max_steps, actor)
            returns.append(rollout["next", "reward"].sum().item())
    return sum(returns) / len(returns)


def evaluation_line(mean_return: float, episodes: int) -> str:
    return (
        f"evaluation: mean return {mean_return:.1f} over {episodes} episode(s) "
        f"(random policy on Pendulum-v1: about -1200; solved: about -200)"
    )


def policy_tensors(actor: ProbabilisticActor) -> dict[str, torch.Tensor]:
    """The actor's weights (the critics and the temperature are not part of the policy)."""
    return {f"actor.{k}": v for k, v in actor.state_dict().items()}


def policy_from_weights(cfg: DictConfig, state: dict[str, torch.Tensor]) -> ProbabilisticActor:
    """The run's actor, from its config and :func:`policy_tensors` (built against ``cfg.env``)."""
    env = instantiate(cfg.env)
    try:
        actor = make_actor(cfg, env)
        actor.load_state_dict(strip(state, "actor."))
    finally:
        env.close()
    return actor


def rollout_saved(cfg: DictConfig, actor: ProbabilisticActor, episodes: int | None = None) -> str:
    """Evaluate a saved actor exactly as the run did (same environment seed, same line)."""
    episodes = episodes or cfg.eval.episodes
    env = instantiate(cfg.env)
    try:
        env.set_seed(cfg.seed + EVAL_SEED_OFFSET)
        return evaluation_line(evaluate_policy(env, actor, episodes, cfg.eval.max_steps), episodes)
    finally:
        env.close()


@hydra.main(config_path="../configs", config_name="sac", version_base=None)
def main(cfg: DictConfig) -> float:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    with recipe_run(cfg, "sac") as run:
        env = instantiate(cfg.env)
        env.set_seed(cfg.seed)
        eval_env = instantiate(cfg.env)
        eval_env.set_seed(cfg.seed + EVAL_SEED_OFFSET)

        actor, critic = make_actor(cfg, env), make_critic(cfg, env)
        with torch.no_grad():  # initialise lazy shapes
            actor(env.reset())
        loss = instantiate(cfg.model.loss)(
            actor_network=actor, qvalue_network=critic, action_spec=env.action_spec
        )
        loss.make_value_estimator(gamma=cfg.model.gamma)
        target_update = SoftUpdate(loss, tau=cfg.model.tau)
        optim = instantiate(cfg.model.optimizer)(loss.parameters())

        n_envs = int(cfg.get("envs", 1))
        window = int(cfg.get("window", 0))
        if window > 0:
            sampler = SequenceWindowSampler(window, generator=cfg.seed)
            batch_size = max(1, cfg.batch_size // window) * window
        else:
            sampler = make_sampler(cfg.sampler, cfg.get("ere"))
            batch_size = cfg.batch_size
        ere = getattr(sampler, "ere", None)
        prioritized = isinstance(sampler, PrioritizedSampler)
        storage = instantiate(cfg.store, ndim=2 if n_envs > 1 else 1)
        buffer = TensorDictReplayBuffer(
            storage=storage, sampler=sampler, batch_size=batch_size, priority_key="td_error"
        )
        if n_envs > 1:
            collect_env = SerialEnv(n_envs, lambda: instantiate(cfg.env))
            collect_env.set_seed(cfg.seed)
        else:
            collect_env = env
        collector = instantiate(cfg.collector)(create_env_fn=collect_env, policy=actor)
        run.log.info(f"replay: StoreReplay(ndim={storage.ndim}) over {n_envs} env(s), {sampler}")

        log = run.metrics
        total = cfg.collector.total_frames
        frames, updates = 0, 0
        episode_return = [0.0] * n_envs
        run.policy_tensors = lambda: (policy_tensors(actor), updates)
        try:
            with (
                run.interrupts_at_checks(),
                tqdm(
                    total=total, desc="sac", unit="frame", disable=None, **bar_width(sys.stderr)
                ) as bar,
            ):
                for batch in collector:
                    # one env: [T] rows; several: [n_envs, T], kept as env streams (ndim=2)
                    batch = batch.reshape(n_envs, -1) if n_envs > 1 else batch.reshape(-1)
                    batch = batch.select(*KEEP)
                    buffer.extend(batch)
                    frames += batch.numel()
                    bar.update(batch.numel())
                    rewards = batch["next", "reward"].reshape(n_envs, -1).tolist()
                    ends = batch["next", "done"].reshape(n_envs, -1).tolist()
                    for i in range(n_envs):  # each env's rows are its consecutive steps
                        for reward, end in zip(rewards[i], ends[i]):
                            episode_return[i] += reward
                            if end:
                                log.log(updates, {"train/episode_return": episode_return[i]})
                                episode_return[i] = 0.0
                    run.check()
                    if frames < cfg.collector.init_random_frames:
                        continue
                    n_updates = max(1, math.floor(batch.numel() * cfg.updates_per_frame))
                    for k in range(1, n_updates + 1):
                        if ere is not None:
                            ere.set_progress(k, n_updates, frac=min(1.0, frames / total))
                        sample = buffer.sample()
                        losses = loss(sample)
                        total_loss = (
                            losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]
                        )
                        optim.zero_grad()
                        total_loss.backward()
                        optim.step()
                        target_update.step()
                        if prioritized:
                            buffer.update_tensordict_priority(sample)
                        updates += 1
                        run.check()
                        if updates % cfg.log_every == 0 or updates == 1:
                            log.log(
                                updates,
                                {
                                    k_: v
                                    for k_, v in losses.items()
                                    if k_.startswith("loss") or k_ == "alpha"
                                },
                            )
                    bar.set_postfix(updates=updates, loss_q=f"{losses['loss_qvalue'].item():.3f}")
        finally:
            collector.shutdown()  # closes the SerialEnv too

        with run.interrupts_at_checks():
            mean_return = evaluate_policy(
                eval_env, actor, cfg.eval.episodes, cfg.eval.max_steps, check=run.check
            )
        log.log(updates, {"eval/return": mean_return})
        run.log.info(f"frames {frames}, gradient steps {updates}")
        run.log.info(evaluation_line(mean_return, cfg.eval.episodes))
    return mean_return


if __name__ == "__main__":
    main()
