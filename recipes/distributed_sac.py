"""SAC on Pendulum-v1 with 2 collector actors and 1 learner on a local Ray cluster.

    python recipes/distributed_sac.py                                  # 6k frames
    python recipes/distributed_sac.py sampler=prioritized
    python recipes/distributed_sac.py rounds=3 frames_per_round=100 init_random_frames=200 \\
        eval.episodes=1                                                # smoke

Pieces: ``torchstore.distributed.serve_replay`` (torchrl's ``RayReplayBuffer`` holding a
torchstore ``StoreReplay`` ring in a Ray actor), ``start_collectors`` (``ShardCollector``
actors running torchrl's ``Collector`` over ``GymEnv``, each extending the buffer and
committing its finished episodes to ``shards/collector-K.h5``), and the learner: this
process, training torchrl's ``SACLoss`` on ``buffer.sample()`` while the collectors run,
sending the actor's weights to them after every round. Ray runs on this machine only.

Outputs (``outputs/distributed_sac/<time>/``): ``config.yaml``, ``metrics.csv``,
``loss.png``, ``policy.safetensors``, ``distributed_sac.log``, ``shards/`` (the collectors'
stores, one ``StoreSet``) and ``replay/`` (the buffer's ``dumps``; ``serve_replay(...,
resume=...)`` starts from it).
"""

from __future__ import annotations

import functools
import math
import os
import time
from pathlib import Path

import hydra
import torch
from _common import recipe_run
from hydra.utils import instantiate
from omegaconf import DictConfig
from sac import evaluate_policy, evaluation_line, make_actor, make_critic, policy_tensors
from sac import policy_from_weights as policy_from_weights  # noqa: PLC0414 (rollout.py)
from sac import rollout_saved as rollout_saved  # noqa: PLC0414
from torchrl.objectives import SoftUpdate

from torchstore.data import StoreSet

RECIPES = Path(__file__).resolve().parent


@hydra.main(config_path="../configs", config_name="distributed_sac", version_base=None)
def main(cfg: DictConfig) -> float:
    import ray

    from torchstore.distributed import init_local_ray, serve_replay, start_collectors

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    with recipe_run(cfg, "distributed_sac") as run:
        # the collector actors import this folder's ``sac`` module to build their actor
        path = os.pathsep.join([str(RECIPES), *filter(None, [os.environ.get("PYTHONPATH")])])
        init_local_ray(cfg.ray.num_cpus, runtime_env={"env_vars": {"PYTHONPATH": path}})
        env = instantiate(cfg.env)
        env.set_seed(cfg.seed)
        actor, critic = make_actor(cfg, env), make_critic(cfg, env)
        with torch.no_grad():
            actor(env.reset())
        loss = instantiate(cfg.model.loss)(
            actor_network=actor, qvalue_network=critic, action_spec=env.action_spec
        )
        loss.make_value_estimator(gamma=cfg.model.gamma)
        target_update = SoftUpdate(loss, tau=cfg.model.tau)
        optim = instantiate(cfg.model.optimizer)(loss.parameters())
        buffer = serve_replay(
            cfg.capacity,
            batch_size=cfg.batch_size,
            sampler=cfg.sampler,
            num_cpus=cfg.ray.buffer_cpus,
        )
        collectors = start_collectors(
            buffer,
            run.folder.path / "shards",
            cfg.collectors,
            num_cpus=cfg.ray.collector_cpus,
            seed=cfg.seed,
            env_name=cfg.env.env_name,
            policy_factory=functools.partial(make_actor, cfg),
        )
        log = run.metrics
        updates = 0
        run.policy_tensors = lambda: (policy_tensors(actor), updates)
        try:
            for round_ in range(cfg.rounds):
                started = time.perf_counter()
                pending = [c.collect.remote(cfg.frames_per_round) for c in collectors]
                rows = len(buffer)
                budget = math.floor(cfg.collectors * cfg.frames_per_round * cfg.updates_per_frame)
                done_updates = 0
                with run.interrupts_at_checks():
                    # the learner trains while the round is collected
                    while (
                        rows >= max(cfg.init_random_frames, cfg.batch_size)
                        and done_updates < budget
                    ):
                        sample = buffer.sample()
                        losses = loss(sample)
                        total = losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]
                        optim.zero_grad()
                        total.backward()
                        optim.step()
                        target_update.step()
                        if cfg.sampler == "prioritized":
                            buffer.update_tensordict_priority(sample)
                        updates += 1
                        done_updates += 1
                        if updates % cfg.log_every == 0 or updates == 1:
                            log.log(
                                updates, {k: v for k, v in losses.items() if k.startswith("loss")}
                            )
                        run.check()
                    stats = ray.get(pending)
                    weights = ray.put(
                        {k: v.detach().clone() for k, v in actor.state_dict().items()}
                    )
                    ray.get([c.set_weights.remote(weights) for c in collectors])
                    run.check()
                run.log.info(
                    f"round {round_ + 1}/{cfg.rounds}: buffer {len(buffer)} rows, "
                    f"{sum(s['episodes'] for s in stats)} episodes committed to shards, "
                    f"{done_updates} updates, {time.perf_counter() - started:.1f} s"
                )
            buffer.dumps(run.folder.path / "replay")
            ray.get([c.close.remote() for c in collectors])
            with StoreSet(run.folder.path / "shards") as shards:
                run.log.info(
                    f"shards: {len(shards.shards)} files, {shards.num_episodes} episodes, "
                    f"{len(shards)} rows"
                )
        finally:
            for c in collectors:
                ray.kill(c)
            buffer.close()
            ray.shutdown()
        with run.interrupts_at_checks():
            mean_return = evaluate_policy(
                env, actor, cfg.eval.episodes, cfg.eval.max_steps, check=run.check
            )
        log.log(updates, {"eval/return": mean_return})
        run.log.info(f"gradient steps {updates}")
        run.log.info(evaluation_line(mean_return, cfg.eval.episodes))
    return mean_return


if __name__ == "__main__":
    main()
