"""Write a small RLDS dataset with tensorflow-datasets' own writer, and tfds's decoding of it.

Run inside the venv of ``tests/formats/tfds_venv.sh`` (CI has no TensorFlow):

    /tmp/tfds/bin/python tests/formats/make_rlds_fixture.py [OUT]

OUT defaults to ``tests/formats/fixtures/rlds_tiny``: it is emptied, then holds the TFDS
version folder ``1.0.0/`` (``dataset_info.json``, ``features.json``, two TFRecord shards)
and ``expected.npz``, every step and every feature as ``tfds.builder_from_directory(...)
.as_dataset()`` decodes them (see :func:`tfds_values`). tests/formats/test_rlds.py imports
the shipped folder and compares with ``expected.npz`` exactly; in the venv it also calls
:func:`write_dataset` and :func:`tfds_values` itself on a fresh dataset.

The dataset is shaped like an Open X-Embodiment one: ``steps`` (a ``tfds.features.Dataset``)
with a nested ``observation`` dict (a JPEG camera, a PNG wrist camera, a uint16 PNG depth
image and a float32 one, a float32 state, a float64 joint vector, a zlib-encoded int32
tensor), a float32 action vector, reward,
discount, ``is_first``/``is_last``/``is_terminal``, ``language_instruction`` (Text) and
``language_embedding``; episode-level ``episode_metadata`` with ``file_path`` (Text) and an
int64 ``episode_id``. Episodes have different lengths.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np

NAME = "rlds_tiny"
VERSION = "1.0.0"
#: The depth cameras' shape (of the fixture's dataset; the benchmark's has none).
DEPTH = (6, 8, 1)
#: Steps of each episode (different lengths; split over two shards).
LENGTHS = (3, 5, 2, 7, 4)
INSTRUCTIONS = (
    "pick up the red block",
    "put the café cup on the plate \N{TEACUP WITHOUT HANDLE}",
    "open the drawer",
)


def features(image=(32, 32, 3), wrist=(16, 16, 3)):
    """The tfds FeaturesDict of the dataset (an Open X-Embodiment-like RLDS layout); with
    ``wrist`` None, the JPEG camera is the only image (no wrist or depth cameras)."""
    import tensorflow_datasets as tfds

    f = tfds.features
    observation = {
        "image": f.Image(shape=image, dtype=np.uint8, encoding_format="jpeg"),
        "state": f.Tensor(shape=(8,), dtype=np.float32),
        "joint_pos": f.Tensor(shape=(3,), dtype=np.float64),
        "tactile": f.Tensor(shape=(2, 3), dtype=np.int32, encoding="zlib"),
    }
    if wrist is not None:
        observation["wrist_image"] = f.Image(shape=wrist, dtype=np.uint8, encoding_format="png")
        # depth cameras: a 16-bit PNG, and float32 bit-cast into an RGBA PNG by tfds
        observation["depth"] = f.Image(shape=DEPTH, dtype=np.uint16, encoding_format="png")
        observation["depth_m"] = f.Image(shape=DEPTH, dtype=np.float32, encoding_format="png")
    return f.FeaturesDict(
        {
            "steps": f.Dataset(
                {
                    "observation": f.FeaturesDict(observation),
                    "action": f.Tensor(shape=(7,), dtype=np.float32),
                    "reward": f.Scalar(dtype=np.float32),
                    "discount": f.Scalar(dtype=np.float32),
                    "is_first": f.Scalar(dtype=np.bool_),
                    "is_last": f.Scalar(dtype=np.bool_),
                    "is_terminal": f.Scalar(dtype=np.bool_),
                    "language_instruction": f.Text(),
                    "language_embedding": f.Tensor(shape=(4,), dtype=np.float32),
                }
            ),
            "episode_metadata": f.FeaturesDict(
                {"file_path": f.Text(), "episode_id": f.Scalar(dtype=np.int64)}
            ),
        }
    )


def _image(rng, shape, t):
    """A smooth picture with some noise: JPEG-like content, small once encoded."""
    h, w, c = shape
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 7 + t * 13 + k * 40) % 256 for k in range(c)], axis=-1)
    base = base + (y[..., None] * 3)
    return np.clip(base + rng.integers(-8, 9, size=shape), 0, 255).astype(np.uint8)


def episodes(lengths=LENGTHS, image=(32, 32, 3), wrist=(16, 16, 3), seed=0):
    """The episodes, as the dicts tfds's writer encodes."""
    rng = np.random.default_rng(seed)
    out = []
    for e, n in enumerate(lengths):
        text = INSTRUCTIONS[e % len(INSTRUCTIONS)]
        steps = []
        for t in range(n):
            observation = {
                "image": _image(rng, image, t + e),
                "state": rng.standard_normal(8).astype(np.float32),
                # float64 values tfds keeps only to float32 precision
                "joint_pos": rng.standard_normal(3) * 1e3,
                "tactile": rng.integers(-(2**31), 2**31 - 1, (2, 3)).astype(np.int32),
            }
            if wrist is not None:
                observation["wrist_image"] = _image(rng, wrist, 3 * t + e)
                observation["depth"] = rng.integers(0, 2**16, DEPTH, dtype=np.uint16)
                observation["depth_m"] = rng.uniform(0.1, 4.0, DEPTH).astype(np.float32)
            steps.append(
                {
                    "observation": observation,
                    "action": rng.uniform(-1, 1, 7).astype(np.float32),
                    "reward": np.float32(t == n - 1),
                    "discount": np.float32(1.0),
                    "is_first": t == 0,
                    "is_last": t == n - 1,
                    "is_terminal": t == n - 1 and e % 2 == 0,
                    # one episode changes its instruction mid-way
                    "language_instruction": text if e != 3 or t < 4 else INSTRUCTIONS[0],
                    "language_embedding": rng.standard_normal(4).astype(np.float32),
                }
            )
        out.append(
            {
                "steps": steps,
                "episode_metadata": {
                    "file_path": f"/data/raw/episode_{e:03d}.npy",
                    "episode_id": 1000 + e,
                },
            }
        )
    return out


def write_dataset(
    data_dir, *, lengths=LENGTHS, image=(32, 32, 3), wrist=(16, 16, 3), shards=2, name=NAME
) -> Path:
    """Write the dataset with tfds's writer under ``data_dir``; returns its version folder."""
    import tensorflow_datasets as tfds

    builder = tfds.dataset_builders.store_as_tfds_dataset(
        name=name,
        version=VERSION,
        features=features(image, wrist),
        split_datasets={"train": list(enumerate(episodes(lengths, image, wrist)))},
        data_dir=os.fspath(data_dir),
        download_config=tfds.download.DownloadConfig(num_shards=shards),
        description="A tiny Open X-Embodiment-shaped RLDS dataset for torchstore's tests.",
    )
    return Path(builder.data_dir)


def _leaves(tree, prefix=""):
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _leaves(value, f"{name}/")
        else:
            yield name, value


def tfds_values(version_dir, split="train") -> dict[str, np.ndarray]:
    """tfds's own decoding of every episode: a flat dict of arrays.

    ``steps/<feature>``: every step of every episode concatenated in record order (text as
    str); ``episode_metadata/<feature>``: one value per episode; ``lengths``: steps per
    episode.
    """
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(os.fspath(version_dir))
    ds = builder.as_dataset(split=split, shuffle_files=False)
    columns: dict[str, list] = {}
    lengths = []
    for episode in tfds.as_numpy(ds):
        n = 0
        for step in episode["steps"]:
            n += 1
            for name, value in _leaves(step, "steps/"):
                columns.setdefault(name, []).append(value)
        lengths.append(n)
        for name, value in _leaves(episode["episode_metadata"], "episode_metadata/"):
            columns.setdefault(name, []).append(value)
    out = {"lengths": np.asarray(lengths, dtype=np.int64)}
    for name, values in columns.items():
        if isinstance(values[0], bytes):
            out[name] = np.asarray([v.decode("utf-8") for v in values])
        else:
            out[name] = np.stack(values)
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else Path(__file__).parent / "fixtures" / NAME)
    tmp = out.with_name(f".{out.name}.writing")
    shutil.rmtree(tmp, ignore_errors=True)
    version_dir = write_dataset(tmp / "data")
    values = tfds_values(version_dir)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copytree(version_dir, out / VERSION)
    np.savez_compressed(out / "expected.npz", **values)
    shutil.rmtree(tmp)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out}: {sorted(p.name for p in (out / VERSION).iterdir())}, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
