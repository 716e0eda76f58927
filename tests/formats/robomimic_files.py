"""Small robomimic-layout files written the way each recorder writes them (h5py calls as in
robomimic 0.3.0's dataset_states_to_obs.py and create_hdf5_filter_key, LIBERO's
create_dataset.py, Isaac Lab's HDF5DatasetFileHandler and MimicGen's write_demo_to_hdf5),
and a byte-level comparison of two such files."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

IMAGE = (12, 10, 3)


def write_robomimic(path: Path, lengths=(5, 7, 3, 6, 4, 5, 8, 3, 4, 6, 5, 7), seed=0) -> Path:
    """robomimic's dataset_states_to_obs output: float64 low-dim obs, uint8 images (gzip),
    next_obs, states, rewards float64, dones int64, model_file attrs, train/valid masks."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        total = 0
        for i, n in enumerate(lengths):
            ep = data.create_group(f"demo_{i}")
            ep.create_dataset("actions", data=rng.uniform(-1, 1, (n, 7)))
            ep.create_dataset("states", data=rng.normal(size=(n, 32)))
            rewards = np.zeros(n)
            rewards[-1] = 1.0
            ep.create_dataset("rewards", data=rewards)
            dones = np.zeros(n, dtype=np.int64)
            dones[-1] = 1
            ep.create_dataset("dones", data=dones)
            obs = {
                "robot0_eef_pos": rng.normal(size=(n + 1, 3)),
                "robot0_eef_quat": rng.normal(size=(n + 1, 4)),
                "object": rng.normal(size=(n + 1, 10)),
                "agentview_image": rng.integers(0, 256, (n + 1, *IMAGE), dtype=np.uint8),
            }
            for k, v in obs.items():
                opts = {"compression": "gzip"} if "image" in k else {}
                ep.create_dataset(f"obs/{k}", data=np.array(v[:-1]), **opts)
                ep.create_dataset(f"next_obs/{k}", data=np.array(v[1:]), **opts)
            ep.attrs["model_file"] = f"<mujoco model='demo{i}'/>"
            ep.attrs["num_samples"] = n
            total += n
        data.attrs["total"] = total
        env = {
            "env_name": "Lift",
            "type": 1,
            "env_kwargs": {"control_freq": 20, "robots": ["Panda"]},
        }
        data.attrs["env_args"] = json.dumps(env, indent=4)
    names = [f"demo_{i}" for i in range(len(lengths))]
    order = np.random.default_rng(seed + 1).permutation(len(names))
    valid = [names[i] for i in order[: max(1, len(names) // 5)]]
    train = [names[i] for i in order[len(valid) :]]
    for key, demos in (("train", train), ("valid", valid)):
        with h5py.File(path, "a") as f:  # robomimic's create_hdf5_filter_key
            f[f"mask/{key}"] = np.array(demos, dtype="S")
    return path


def write_libero(path: Path, lengths=(6, 4, 9), seed=0) -> Path:
    """LIBERO's create_dataset.py: uint8 rewards and dones, robot_states, file-level
    problem_info / bddl_file_name / env_name, per-demo init_state (array attribute)."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        grp = f.create_group("data")
        problem = {
            "problem_name": "libero_kitchen_tabletop_manipulation",
            "language_instruction": "open the top drawer",
        }
        grp.attrs["env_name"] = "Libero_Kitchen_Tabletop_Manipulation"
        grp.attrs["problem_info"] = json.dumps(problem)
        grp.attrs["macros_image_convention"] = "opengl"
        env_args = {"type": 1, "env_name": "Libero_Kitchen", "env_kwargs": {"has_renderer": False}}
        grp.attrs["env_args"] = json.dumps(env_args)
        grp.attrs["bddl_file_name"] = "libero/bddl_files/libero_10/KITCHEN_SCENE3_open.bddl"
        grp.attrs["bddl_file_content"] = "(define (problem LIBERO_Kitchen_Tabletop_Manipulation))"
        total = 0
        for i, n in enumerate(lengths):
            ep = grp.create_group(f"demo_{i}")
            obs = ep.create_group("obs")
            obs.create_dataset("gripper_states", data=rng.normal(size=(n, 2)))
            obs.create_dataset("joint_states", data=rng.normal(size=(n, 7)))
            obs.create_dataset("ee_pos", data=rng.normal(size=(n, 3)))
            obs.create_dataset(
                "agentview_rgb", data=rng.integers(0, 256, (n, *IMAGE), dtype=np.uint8)
            )
            obs.create_dataset(
                "eye_in_hand_rgb", data=rng.integers(0, 256, (n, *IMAGE), dtype=np.uint8)
            )
            ep.create_dataset("actions", data=rng.uniform(-1, 1, (n, 7)))
            states = rng.normal(size=(n, 45))
            ep.create_dataset("states", data=states)
            ep.create_dataset("robot_states", data=rng.normal(size=(n, 9)))
            rewards = np.zeros(n, dtype=np.uint8)
            rewards[-1] = 1
            ep.create_dataset("rewards", data=rewards)
            ep.create_dataset("dones", data=rewards.copy())
            ep.attrs["num_samples"] = n
            ep.attrs["model_file"] = f"<mujoco model='libero{i}'/>"
            ep.attrs["init_state"] = states[0]
            total += n
        grp.attrs["num_demos"] = len(lengths)
        grp.attrs["total"] = total
    return path


def write_isaaclab(path: Path, lengths=(5, 3, 6), seed=0) -> Path:
    """Isaac Lab's HDF5DatasetFileHandler: gzip everywhere, nested obs / states groups
    (float32, from torch), per-demo initial_state, seed and success attributes."""
    rng = np.random.default_rng(seed)

    def write(group: h5py.Group, key: str, value) -> None:
        if isinstance(value, dict):
            sub = group.create_group(key)
            for k, v in value.items():
                write(sub, k, v)
        else:
            frames = {"chunks": (1, *value.shape[1:]), "maxshape": (None, *value.shape[1:])}
            opts = frames if key == "table_cam" else {}  # a camera appended frame by frame
            group.create_dataset(key, data=value, compression="gzip", **opts)

    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["total"] = 0
        data.attrs["env_args"] = json.dumps(
            {"env_name": "Isaac-Stack-Cube-Franka-IK-Rel-v0", "type": 2}
        )
        for i, n in enumerate(lengths):
            ep = data.create_group(f"demo_{i}")
            ep.attrs["num_samples"] = n
            ep.attrs["seed"] = 42 + i
            ep.attrs["success"] = bool(i % 2 == 0)
            f32 = np.float32
            episode = {
                "actions": rng.normal(size=(n, 7)).astype(f32),
                "obs": {
                    "joint_pos": rng.normal(size=(n, 9)).astype(f32),
                    "eef_pos": rng.normal(size=(n, 3)).astype(f32),
                    "table_cam": rng.integers(0, 256, (n, *IMAGE), dtype=np.uint8),
                },
                "initial_state": {
                    "articulation": {
                        "robot": {"joint_position": rng.normal(size=(1, 9)).astype(f32)}
                    },
                    "rigid_object": {"cube_1": {"root_pose": rng.normal(size=(1, 7)).astype(f32)}},
                },
                "states": {
                    "articulation": {
                        "robot": {"joint_position": rng.normal(size=(n, 9)).astype(f32)}
                    },
                    "rigid_object": {"cube_1": {"root_pose": rng.normal(size=(n, 7)).astype(f32)}},
                },
            }
            for key, value in episode.items():
                write(ep, key, value)
            data.attrs["total"] += n
    return path


def write_mimicgen(path: Path, lengths=(6, 2, 9), subtasks=2, labels_per_step=True, seed=0):
    """MimicGen's generated dataset (write_demo_to_hdf5 in mimicgen/utils/file_utils.py):
    actions, states, obs, datagen_info/..., src_demo_inds (one per subtask, int64) and
    src_demo_labels (the source demo of each step, [T, 1]; with ``labels_per_step``
    false, one demo's has other rows, as a writer that labels only some steps leaves)."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        total = 0
        for i, n in enumerate(lengths):
            ep = data.create_group(f"demo_{i}")
            ep.create_dataset("actions", data=rng.uniform(-1, 1, (n, 7)))
            ep.create_dataset("states", data=rng.normal(size=(n, 45)))
            ep.create_dataset("obs/robot0_eef_pos", data=rng.normal(size=(n, 3)))
            ep.create_dataset(
                "obs/agentview_image", data=rng.integers(0, 256, (n, *IMAGE), dtype=np.uint8)
            )
            ep.create_dataset("datagen_info/eef_pose", data=rng.normal(size=(n, 4, 4)))
            ep.create_dataset("datagen_info/target_pose", data=rng.normal(size=(n, 4, 4)))
            ep.create_dataset("datagen_info/gripper_action", data=rng.normal(size=(n, 1)))
            ep.create_dataset("datagen_info/object_poses/cube", data=rng.normal(size=(n, 4, 4)))
            grasp = (np.arange(n) >= n // 2).astype(np.int64)
            ep.create_dataset("datagen_info/subtask_term_signals/grasp", data=grasp)
            inds = rng.integers(0, 10, subtasks)
            ep.create_dataset("src_demo_inds", data=np.array(inds))
            labels = np.repeat(inds, -(-n // subtasks))[:n, None]
            if not labels_per_step and i == 1:
                labels = labels[:-1]
            ep.create_dataset("src_demo_labels", data=np.array(labels))
            ep.attrs["model_file"] = f"<mujoco model='mimicgen{i}'/>"
            ep.attrs["num_samples"] = n
            total += n
        env = {"env_name": "Stack_D0", "type": 1, "env_kwargs": {"control_freq": 20}}
        data.attrs["env_args"] = json.dumps(env, indent=4)
        data.attrs["total"] = total
        f["mask/train"] = np.array([f"demo_{i}" for i in range(len(lengths))], dtype="S")
    return path


def _attrs(obj) -> dict:
    out = {}
    for name in obj.attrs:
        value = obj.attrs[name]
        array = np.asarray(value)
        out[name] = (
            type(value).__name__,
            array.dtype.str,
            array.shape,
            array.tobytes() if array.dtype.kind != "O" else repr(value),
        )
    return out


def describe(path: Path) -> dict:
    """Every group and dataset of a file: datasets as (dtype, shape, bytes, compression,
    attributes), groups and the root as their attributes."""
    out: dict = {}
    with h5py.File(path, "r") as f:
        out["/"] = _attrs(f)

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                value = obj[()]
                out[name] = (
                    obj.dtype.str,
                    obj.shape,
                    np.asarray(value).tobytes(),
                    (obj.chunks, obj.maxshape, obj.compression, obj.compression_opts),
                    (obj.shuffle, obj.fletcher32),
                    _attrs(obj),
                )
            else:
                out[name] = _attrs(obj)

        f.visititems(visit)
    return out
