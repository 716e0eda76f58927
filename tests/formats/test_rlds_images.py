"""RLDS image features kept as their JPEG / PNG bytes (encoded columns): the disk they
take, the pixels they read back as (tfds's: the decode of the source bytes with
TensorFlow's settings), frames of another format than their feature's, damaged frames.

The datasets here are written by the tests' own writer (features.json, dataset_info.json
and TFRecord shards of tf.train.Examples, no TensorFlow) from camera-like frames
(benchmarks/_camera_frames.py: a photograph panned and zoomed, not noise)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from torchstore import TrajectoryStore
from torchstore.errors import ArgumentError, DatasetFormatError
from torchstore.formats import import_rlds
from torchstore.io.records.tfrecord import serialize_example, write_records

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _camera_frames import camera_frames  # noqa: E402

simplejpeg = pytest.importorskip("simplejpeg")
Image = pytest.importorskip("PIL.Image")

KEY = "steps/observation/image"


def _feature(cls: str, **content) -> dict:
    return {"pythonClassName": f"tensorflow_datasets.core.features.{cls}", **content}


def _image_feature(shape, encoding: str | None) -> dict:
    image = {"dtype": "uint8", "shape": {"dimensions": [str(d) for d in shape]}}
    if encoding is not None:
        image["encodingFormat"] = encoding
    return _feature("image_feature.Image", image=image)


def write_dataset(
    root: Path, episodes: list[list[bytes]], shape=(96, 128, 3), encoding="jpeg", shards=2
) -> Path:
    """An RLDS version folder whose steps hold ``observation/image`` (the given frame
    bytes, one list per episode), ``action`` float32[7] and ``is_first``."""
    steps = {
        "observation": _feature(
            "features_dict.FeaturesDict",
            featuresDict={"features": {"image": _image_feature(shape, encoding)}},
        ),
        "action": _feature(
            "tensor_feature.Tensor",
            tensor={"dtype": "float32", "encoding": "none", "shape": {"dimensions": ["7"]}},
        ),
        "is_first": _feature(
            "scalar.Scalar", tensor={"dtype": "bool", "encoding": "none", "shape": {}}
        ),
    }
    dataset = _feature(
        "dataset_feature.Dataset",
        sequence={
            "feature": _feature("features_dict.FeaturesDict", featuresDict={"features": steps})
        },
    )
    features = _feature("features_dict.FeaturesDict", featuresDict={"features": {"steps": dataset}})
    root.mkdir(parents=True, exist_ok=True)
    (root / "features.json").write_text(json.dumps(features))
    parts = [p.tolist() for p in np.array_split(np.arange(len(episodes)), shards)]  # in order
    split = {
        "name": "train",
        "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
        "shardLengths": [str(len(p)) for p in parts],
    }
    info = {"name": "cams", "fileFormat": "tfrecord", "version": "1.0.0", "splits": [split]}
    (root / "dataset_info.json").write_text(json.dumps(info))
    for s, part in enumerate(parts):
        records = []
        for e in part:
            n = len(episodes[e])
            action = np.random.default_rng(e).standard_normal(7 * n).astype(np.float32)
            values = {KEY: episodes[e], "steps/action": action}
            values["steps/is_first"] = (np.arange(n) == 0).astype(np.int64)
            records.append(serialize_example(values))
        write_records(root / f"cams-train.tfrecord-{s:05d}-of-{shards:05d}", records)
    return root


def jpeg(frame: np.ndarray, quality: int = 90) -> bytes:
    return simplejpeg.encode_jpeg(frame, quality=quality)


def png(frame: np.ndarray, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(frame).save(out, format="PNG", **options)
    return out.getvalue()


def tfds_pixels(blob: bytes, channels: int = 3) -> np.ndarray:
    """A frame as tfds decodes it: JPEG with TensorFlow's libjpeg settings (the fast
    integer DCT, fancy upsampling), PNG losslessly."""
    if blob[:3] == b"\xff\xd8\xff":
        space = {1: "GRAY", 3: "RGB"}[channels]
        return simplejpeg.decode_jpeg(blob, space, fastdct=True, fastupsample=False)
    with Image.open(io.BytesIO(blob)) as img:
        return np.asarray(img.convert({1: "L", 3: "RGB"}[channels])).reshape(
            img.height, img.width, channels
        )


def camera_episodes(lengths, shape=(96, 128, 3), encode=jpeg) -> list[list[bytes]]:
    return [
        [encode(f) for f in camera_frames(n, shape[0], shape[1], episode=e)]
        for e, n in enumerate(lengths)
    ]


def read_images(path: Path) -> tuple[np.ndarray, object]:
    with TrajectoryStore(path) as store:
        column = next(c for c in store.manifest.columns if c.name == "observation/image")
        return store.read_column("observation/image", 0, store.num_rows), column


def shard_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.glob("*.tfrecord-*"))


@pytest.fixture(scope="module")
def cameras() -> list[list[bytes]]:
    return camera_episodes((30, 12, 25, 17))


def test_kept_jpeg_frames_take_the_shards_disk_and_read_as_tfds_decodes_them(tmp_path):
    # 500 frames of 256x256 at tfds's JPEG quality (95): 15 MiB of shards, enough that the
    # store's fixed part (its tables' first chunks, about 0.5 MiB) is not what is measured
    episodes = camera_episodes((120, 90, 150, 140), (256, 256, 3), lambda f: jpeg(f, 95))
    root = write_dataset(tmp_path / "src" / "cams" / "1.0.0", episodes, (256, 256, 3))
    out = import_rlds(root, tmp_path / "kept.h5", progress=False)
    ratio = out.stat().st_size / shard_bytes(root)
    assert ratio <= 1.05, ratio
    got, column = read_images(out)
    assert column.codec is not None and column.codec.kind == "jpeg"
    want = np.stack([tfds_pixels(b) for episode in episodes for b in episode])
    np.testing.assert_array_equal(got, want)


def test_decoded_images_read_as_the_kept_ones_on_far_more_disk(cameras, tmp_path):
    root = write_dataset(tmp_path / "src" / "cams" / "1.0.0", cameras)
    kept = import_rlds(root, tmp_path / "kept.h5", progress=False)
    decoded = import_rlds(root, tmp_path / "decoded.h5", progress=False, images="decode")
    frames = sum(map(len, cameras)) * 96 * 128 * 3
    assert decoded.stat().st_size > frames > 2 * kept.stat().st_size  # kept: 0.5 MiB of it fixed
    got, column = read_images(decoded)
    assert column.codec is None
    np.testing.assert_array_equal(got, read_images(kept)[0])
    np.testing.assert_array_equal(got, np.stack([tfds_pixels(b) for e in cameras for b in e]))


@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda b: b[: len(b) // 2], "Premature end"),  # a truncated body, the header intact
        (lambda b: b[:2000] + bytes(40) + b[2040:], "cannot be decoded"),  # zeroed entropy data
        (lambda b: b"\0\0\0\0" + b[4:], "cannot be decoded"),  # no start-of-image marker
    ],
)
def test_a_damaged_jpeg_is_refused_at_import_naming_its_episode_and_step(
    cameras, tmp_path, damage, needle
):
    episodes = [list(e) for e in cameras]
    episodes[2][7] = damage(episodes[2][7])
    root = write_dataset(tmp_path / "src" / "cams" / "1.0.0", episodes)
    dest = tmp_path / "out" / "s.h5"
    with pytest.raises(DatasetFormatError) as info:
        import_rlds(root, dest, progress=False)
    message = str(info.value)
    for part in ("episode 2", f"'{KEY}' step 7", needle):
        assert part in message, (part, message)
    assert not dest.exists() and not any(dest.parent.glob("*"))


def test_a_png_frame_in_a_jpeg_feature_makes_that_feature_a_raw_column(tmp_path):
    frames = camera_frames(9, 48, 64)
    episodes = [[jpeg(f) for f in frames[:5]], [jpeg(frames[5]), png(frames[6]), jpeg(frames[7])]]
    root = write_dataset(tmp_path / "src" / "cams" / "1.0.0", episodes, shape=(48, 64, 3))
    out = import_rlds(root, tmp_path / "mixed.h5", progress=False)
    got, column = read_images(out)
    assert column.codec is None  # no JPEG holds the PNG's pixels exactly
    np.testing.assert_array_equal(got, np.stack([tfds_pixels(b) for e in episodes for b in e]))
    np.testing.assert_array_equal(got[6], frames[6])  # the PNG's own pixels
    with TrajectoryStore(out) as store:
        why = store.manifest.metadata["rlds"]["decoded_images"]["observation/image"]
    assert "episode 1" in why and "step 1" in why and "a PNG" in why


def test_frames_of_other_kinds_in_a_png_feature_are_kept_as_lossless_pngs(tmp_path):
    frames = camera_frames(6, 40, 56)
    palette = Image.fromarray(frames[3]).quantize(64)  # an 8-bit palette PNG
    buffer = io.BytesIO()
    palette.save(buffer, format="PNG")
    grey = png(frames[4][..., 0])  # one channel in an RGB feature
    episodes = [
        [png(frames[0]), jpeg(frames[1]), png(frames[2], compress_level=9)],
        # a transparent colour (tRNS), which FFmpeg would read as RGBA: re-encoded
        [buffer.getvalue(), grey, png(frames[5], transparency=tuple(map(int, frames[5][0, 0])))],
    ]
    root = write_dataset(tmp_path / "src" / "cams" / "1.0.0", episodes, (40, 56, 3), "png")
    out = import_rlds(root, tmp_path / "png.h5", progress=False)
    got, column = read_images(out)
    assert column.codec is not None and column.codec.kind == "png"
    want = np.stack([tfds_pixels(b) for e in episodes for b in e])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[0], frames[0])
    np.testing.assert_array_equal(got[4], np.repeat(frames[4][..., :1], 3, axis=2))
    np.testing.assert_array_equal(got[5], frames[5])


def test_a_feature_of_free_shape_and_no_format_is_kept_as_its_first_frame_is(tmp_path):
    episodes = camera_episodes((4, 3), shape=(32, 48, 3))
    root = write_dataset(tmp_path / "src" / "cams" / "1.0.0", episodes, (-1, -1, 3), None)
    out = import_rlds(root, tmp_path / "free.h5", progress=False)
    got, column = read_images(out)
    assert column.codec.kind == "jpeg" and tuple(column.shape) == (32, 48, 3)
    np.testing.assert_array_equal(got, np.stack([tfds_pixels(b) for e in episodes for b in e]))


def test_a_frame_of_another_size_is_refused_before_it_is_decoded(cameras, tmp_path):
    episodes = [list(e) for e in cameras]
    episodes[1][3] = jpeg(camera_frames(1, 64, 64)[0])
    root = write_dataset(tmp_path / "src" / "cams" / "1.0.0", episodes)
    with pytest.raises(DatasetFormatError, match=r"episode 1 .*step 3: an image of shape \(64, 64"):
        import_rlds(root, tmp_path / "s.h5", progress=False)


def test_episodes_longer_than_a_slab_keep_their_packets_whole(cameras, tmp_path, monkeypatch):
    import torchstore.formats.rlds as rlds

    monkeypatch.setattr(rlds, "_SLAB_BYTES", 600)  # a few rows of action and is_first
    root = write_dataset(tmp_path / "src" / "cams" / "1.0.0", cameras)
    out = import_rlds(root, tmp_path / "long.h5", progress=False)
    got, _ = read_images(out)
    np.testing.assert_array_equal(got, np.stack([tfds_pixels(b) for e in cameras for b in e]))
    with TrajectoryStore(out) as store:
        assert [store.episodes.range(i)[1] - store.episodes.range(i)[0] for i in range(4)] == [
            30,
            12,
            25,
            17,
        ]


def test_an_unknown_images_mode_is_refused(tmp_path):
    with pytest.raises(ArgumentError, match="images must be one of keep, decode"):
        import_rlds(tmp_path, tmp_path / "s.h5", images="raw")


def test_the_cli_decodes_images_when_asked(tmp_path):
    episodes = camera_episodes((3, 2), (24, 32, 3))
    root = write_dataset(tmp_path / "src" / "cams" / "1.0.0", episodes, (24, 32, 3))
    kinds = {}
    for flags in ([], ["--decode-images"]):
        dest = tmp_path / f"cli{len(flags)}.h5"
        cmd = [sys.executable, "-m", "torchstore.cli", "import", "--format", "rlds"]
        run = subprocess.run(
            [*cmd, str(root), str(dest), "--no-progress", *flags],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
        codec = read_images(dest)[1].codec
        kinds[tuple(flags)] = None if codec is None else codec.kind
    assert kinds == {(): "jpeg", ("--decode-images",): None}
