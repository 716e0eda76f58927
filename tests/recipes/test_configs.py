"""Every Hydra config against its targets: keys in the signature, targets allowed, instantiable."""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra._internal.utils import _locate
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
sys.path.insert(0, str(ROOT / "recipes"))
from _common import make_sampler, open_demo_store  # noqa: E402

#: Outside classes a recipe needs; everything else must live under ``torchstore.``.
OUTSIDE_TARGETS = {
    "hydra.utils.get_class",
    "lightning.Trainer",
    "torch.optim.Adam",
    "torch.optim.AdamW",
    "torch.optim.lr_scheduler.CosineAnnealingLR",
    "torchrl.collectors.Collector",
    "torchrl.envs.GymEnv",
    "torchrl.modules.MLP",
    "torchrl.objectives.SACLoss",
    "torchrl.objectives.TD3BCLoss",
}
HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
GROUPS = ("store", "sampler", "datamodule", "model", "trainer", "hydra/job_logging")

#: (top-level config, overrides): together they select every file under configs/.
COMPOSITIONS = [
    ("bc", []),
    ("bc_camera", []),
    ("bc_robomimic", ["store.path=lift.h5"]),
    ("bc_robomimic", ["store.path=lift.h5", "datamodule=robomimic_windowed"]),
    ("offline_rl", []),
    ("offline_rl", ["datamodule.sampler=prioritized"]),
    ("sac", []),
    ("sac", ["sampler=prioritized"]),
    ("sac", ["sampler=prioritized", "sampler.ere=true"]),
    ("distributed_sac", []),
]


def _compose(name: str, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(name, overrides=overrides)


def _targets(node, path="") -> list[tuple[str, DictConfig]]:
    """Every node with a ``_target_``, depth first, with its dotted path."""
    found = []
    if isinstance(node, DictConfig):
        if "_target_" in node:
            found.append((path, node))
        for key in node:
            found += _targets(node._get_node(key), f"{path}.{key}" if path else str(key))
    elif isinstance(node, ListConfig):
        for i, item in enumerate(node):
            found += _targets(item, f"{path}[{i}]")
    return found


def signature_problems(node: DictConfig) -> list[str]:
    """Keys of a ``_target_`` node that its target's signature does not take."""
    target = node["_target_"]
    obj = _locate(target)
    # a class's own __init__: a metaclass __call__ (as torchrl's samplers have) hides it
    params = dict(inspect.signature(obj.__init__ if inspect.isclass(obj) else obj).parameters)
    if inspect.isclass(obj):
        params.pop(next(iter(params)), None)  # self
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    keys = [k for k in node if k not in HYDRA_KEYS]
    return [f"{target} takes no argument '{k}'" for k in keys if k not in params]


def test_the_checker_catches_an_unknown_key():
    node = OmegaConf.create({"_target_": "torchstore.UniformSampler", "with_replacment": True})
    assert signature_problems(node) == [
        "torchstore.UniformSampler takes no argument 'with_replacment'"
    ]


@pytest.mark.parametrize(
    ("name", "overrides"), COMPOSITIONS, ids=lambda v: v if isinstance(v, str) else " ".join(v)
)
def test_config_keys_match_their_targets(name, overrides):
    cfg = _compose(name, overrides)
    nodes = _targets(cfg)
    assert nodes, f"{name} has no _target_"
    problems = []
    for path, node in nodes:
        target = node["_target_"]
        if not (target.startswith("torchstore.") or target in OUTSIDE_TARGETS):
            problems.append(
                f"{path}: _target_ {target} is neither under torchstore. "
                "nor an allowed outside class"
            )
        problems += [f"{path}: {p}" for p in signature_problems(node)]
    assert not problems, "\n".join(problems)
    OmegaConf.resolve(cfg)  # every interpolation resolves


def test_every_config_file_is_composed_by_some_test():
    used = {f"{name}.yaml" for name, _ in COMPOSITIONS}
    for name, overrides in COMPOSITIONS:
        cfg = _compose(name, overrides)
        with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
            hydra_cfg = compose(name, overrides=overrides, return_hydra_config=True)
        for group, choice in hydra_cfg.hydra.runtime.choices.items():
            if group in GROUPS:
                used.add(f"{group}/{choice}.yaml")
        assert cfg
    files = {str(p.relative_to(CONFIGS)) for p in CONFIGS.rglob("*.yaml")}
    assert files - used == set(), f"config files no test composes: {sorted(files - used)}"


def _instantiate_common(cfg: DictConfig):
    store = open_demo_store(cfg.store)
    trainer = instantiate(cfg.trainer, max_steps=1)
    evaluate = instantiate(cfg.eval)
    assert isinstance(evaluate, functools.partial) and evaluate.keywords["episodes"] > 0
    return store, trainer


def test_bc_config_instantiates():
    cfg = _compose("bc", [])
    store, trainer = _instantiate_common(cfg)
    dm = instantiate(cfg.datamodule, store=store)
    assert dm.n_obs_steps == cfg.datamodule.n_obs_steps and trainer.max_steps == 1
    net = instantiate(cfg.model.net, in_features=12, out_features=8)
    assert isinstance(net[1], torch.nn.ReLU)
    optim = instantiate(cfg.model.optimizer)(net.parameters())
    instantiate(cfg.model.scheduler)(optim)


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_offline_rl_config_instantiates(sampler):
    cfg = _compose("offline_rl", [f"datamodule.sampler={sampler}"])
    store, _ = _instantiate_common(cfg)
    dm = instantiate(cfg.datamodule, store=store)
    assert dm.sampler.value == sampler
    for key in ("actor", "critic"):
        instantiate(cfg.model[key], in_features=8, out_features=2)
    assert isinstance(instantiate(cfg.model.loss), functools.partial)


@pytest.mark.parametrize(
    ("overrides", "kind", "has_ere"),
    [
        ([], "UniformSampler", False),
        (["sampler=prioritized"], "PrioritizedSampler", False),
        (["sampler=prioritized", "sampler.ere=true"], "PrioritizedSampler", True),
        (["sampler.ere=true"], "UniformSampler", True),
    ],
)
def test_sac_config_instantiates(overrides, kind, has_ere):
    from torchrl.data import TensorDictReplayBuffer

    from torchstore import ERE

    cfg = _compose("sac", overrides)
    sampler = make_sampler(cfg.sampler, cfg.ere)
    assert type(sampler).__name__ == kind
    assert isinstance(sampler.ere, ERE) == has_ere
    TensorDictReplayBuffer(
        storage=instantiate(cfg.store),
        sampler=sampler,
        batch_size=cfg.batch_size,
        priority_key="td_error",
    )
    env = instantiate(cfg.env)
    assert env.action_spec.shape[-1] == 1
    assert isinstance(instantiate(cfg.collector), functools.partial)
    instantiate(cfg.model.actor, in_features=3, out_features=2)
    env.close()


def test_make_sampler_ere_switch_needs_a_schedule():
    cfg = _compose("sac", ["sampler.ere=true"])
    with pytest.raises(ValueError, match="sampler.ere=true needs a top-level `ere` schedule"):
        make_sampler(cfg.sampler, None)
    assert make_sampler(_compose("sac", ["sampler.ere=false"]).sampler, None).ere is None
