"""RLDS (TFDS folders, Open X-Embodiment) into stores, checked against tfds's own decoding.

The shipped fixture ``fixtures/rlds_tiny`` was written by tensorflow-datasets' writer and
``expected.npz`` holds tfds's ``as_dataset()`` values of it (tests/formats/
make_rlds_fixture.py), so CI, which has no TensorFlow, still checks the importer against
tfds. The last test writes a fresh dataset with tfds and runs only where it imports (the
venv of tests/formats/tfds_venv.sh).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from torchstore import TrajectoryStore
from torchstore.errors import DatasetFormatError, DestinationExistsError, UnsupportedError
from torchstore.formats import import_rlds
from torchstore.io.records.tfrecord import (
    iter_records,
    parse_example,
    serialize_example,
    write_records,
)

FIXTURE = Path(__file__).parent / "fixtures" / "rlds_tiny"
VERSION = FIXTURE / "1.0.0"
SHARDS = sorted(VERSION.glob("rlds_tiny-train.tfrecord-*"))
TEXT = ("language_instruction",)


def assert_matches(store_path: Path, expected: dict[str, np.ndarray]) -> None:
    """Every step and feature of the store equals tfds's decoding, dtype and all."""
    with TrajectoryStore(store_path) as store:
        lengths = expected["lengths"]
        assert store.num_episodes == len(lengths)
        assert store.num_rows == lengths.sum()
        for i, n in enumerate(lengths):
            start, stop = store.episodes.range(i)
            assert stop - start == n
        tables = store.manifest.metadata["rlds"]["string_tables"]
        widened = store.manifest.metadata["rlds"].get("widened", {})
        step_keys = [k for k in expected if k.startswith("steps/")]
        assert sorted(c.name for c in store.columns) == sorted(k[6:] for k in step_keys)
        for key in step_keys:
            name = key[6:]
            got = store.read_column(name, 0, store.num_rows)
            want = expected[key]
            if name in tables:
                strings = np.asarray(tables[name])[got]
                assert strings.tolist() == want.tolist(), name
                assert tables[name] == list(dict.fromkeys(want.tolist())), name
            else:
                if name in widened:  # uint16/uint32: a store holds them as int32/int64
                    assert widened[name] == str(want.dtype), name
                    assert got.dtype == {"uint16": np.int32, "uint32": np.int64}[widened[name]]
                    want = want.astype(got.dtype)
                assert got.dtype == want.dtype, name
                assert got.shape == want.shape, name
                np.testing.assert_array_equal(got, want, err_msg=name)
        for key in (k for k in expected if k.startswith("episode_metadata/")):
            leaf = key.split("/", 1)[1]
            got = [store.episode_metadata(i)["episode_metadata"][leaf] for i in range(len(lengths))]
            assert got == expected[key].tolist(), key


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURE / "expected.npz") as npz:
        return {k: npz[k] for k in npz.files}


@pytest.mark.parametrize("images", ["keep", "decode"])
def test_the_fixture_imports_exactly_as_tfds_decodes_it(expected, tmp_path, images):
    out = import_rlds(FIXTURE, tmp_path / "tiny.h5", progress=False, images=images)
    assert out == tmp_path / "tiny.h5"
    assert_matches(out, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.h5"]  # nothing left aside
    with TrajectoryStore(out) as store:
        codecs = {c.name: c.codec and c.codec.kind for c in store.manifest.columns}
        decoded = store.manifest.metadata["rlds"].get("decoded_images")
    images_kept = {"observation/image": "jpeg", "observation/wrist_image": "png"}
    if images == "decode":
        images_kept = dict.fromkeys(images_kept)
    assert {n: codecs[n] for n in images_kept} == images_kept
    assert codecs["observation/depth"] is None and codecs["observation/depth_m"] is None
    if images == "keep":  # depth images are uint16 / float32: raw columns, and said why
        assert sorted(decoded) == ["observation/depth", "observation/depth_m"]
    else:
        assert decoded is None


def test_metadata_keeps_the_tfds_files_and_where_each_episode_came_from(tmp_path):
    out = import_rlds(VERSION, tmp_path / "tiny.h5", progress=False)
    with TrajectoryStore(out) as store:
        meta = store.manifest.metadata["rlds"]
        assert meta["dataset_info"] == json.loads((VERSION / "dataset_info.json").read_text())
        assert meta["features"] == json.loads((VERSION / "features.json").read_text())
        assert meta["split"] == "train"
        assert set(meta["string_tables"]) == set(TEXT)
        assert meta["widened"] == {"observation/depth": "uint16"}
        records = [store.episode_metadata(i)["rlds"] for i in range(store.num_episodes)]
    counts = [sum(1 for _ in iter_records(s)) for s in SHARDS]
    assert records == [
        {"shard": s.name, "record": r} for s, n in zip(SHARDS, counts) for r in range(n)
    ]
    assert store.column("observation/image").shape == (32, 32, 3)
    assert store.column("is_first").dtype.is_floating_point is False


@pytest.mark.parametrize("images, slab", [("decode", 20_000), ("keep", 2_000)])
def test_many_small_slabs_and_an_episode_longer_than_a_slab(
    expected, tmp_path, monkeypatch, images, slab
):
    import torchstore.formats.rlds as rlds

    monkeypatch.setattr(rlds, "_SLAB_BYTES", slab)  # 3-5 rows; episodes of up to 7
    out = import_rlds(FIXTURE, tmp_path / "tiny.h5", progress=False, images=images)
    assert_matches(out, expected)


def test_a_failure_after_slabs_were_written_leaves_nothing(copy, tmp_path, monkeypatch):
    import torchstore.formats.rlds as rlds

    monkeypatch.setattr(rlds, "_SLAB_BYTES", 20_000)
    shard = copy / SHARDS[1].name

    def change(i, features):
        if i == 2:  # the last episode, after several slabs went to the store
            features["steps/observation/image"][-1] = b"\xff\xd8\xff" + b"\0" * 40

    _rewrite(shard, change)
    _fails(copy, tmp_path, "episode 4", "'steps/observation/image' step", "cannot be decoded")


def _legacy(node: dict) -> dict:
    """features.json as tfds < 4.6 wrote it: ``{"type": ..., "content": ...}``."""
    cls = node["pythonClassName"]
    if "featuresDict" in node:
        content = {k: _legacy(v) for k, v in node["featuresDict"]["features"].items()}
    elif "sequence" in node:
        content = {"feature": _legacy(node["sequence"]["feature"]), "length": None}
    elif "tensor" in node or "image" in node:
        inner = node.get("tensor") or node["image"]
        content = {
            "shape": [int(d) for d in inner["shape"].get("dimensions", [])],
            "dtype": inner["dtype"],
        }
        if "image" in node:
            content["encoding_format"] = inner["encodingFormat"]
        else:
            content["encoding"] = inner["encoding"]
    else:
        content = {}
    return {"type": cls, "content": content}


def test_the_legacy_features_json(expected, copy, tmp_path):
    features = json.loads((copy / "features.json").read_text())
    (copy / "features.json").write_text(json.dumps(_legacy(features)))
    assert_matches(import_rlds(copy, tmp_path / "legacy.h5", progress=False), expected)


def test_an_episode_without_steps_is_skipped_with_a_warning(expected, copy, tmp_path):
    shard = copy / SHARDS[0].name

    def change(i, features):
        if i == 0:
            for key in [k for k in features if k.startswith("steps/")]:
                features[key] = [] if isinstance(features[key], list) else features[key][:0]

    _rewrite(shard, change)
    with pytest.warns(UserWarning, match="1 episodes have no steps"):
        out = import_rlds(copy, tmp_path / "s.h5", progress=False)
    with TrajectoryStore(out) as store:
        assert store.num_episodes == len(expected["lengths"]) - 1
        assert store.num_rows == expected["lengths"][1:].sum()
        assert store.episode_metadata(0)["rlds"] == {"shard": shard.name, "record": 1}


def test_the_store_is_replaced_only_when_asked(tmp_path):
    out = import_rlds(FIXTURE, tmp_path / "tiny.h5", progress=False)
    with pytest.raises(DestinationExistsError):
        import_rlds(FIXTURE, out, progress=False)
    import_rlds(FIXTURE, out, overwrite=True, progress=False)
    with pytest.raises(DatasetFormatError, match="no split 'test'"):
        import_rlds(FIXTURE, tmp_path / "t.h5", split="test", progress=False)


# ---------------------------------------------------------------------------------------
# hostile inputs: each a DatasetFormatError naming the file, episode and key; nothing at dest


@pytest.fixture
def copy(tmp_path) -> Path:
    target = tmp_path / "src" / "rlds_tiny" / "1.0.0"
    shutil.copytree(VERSION, target)
    return target


def _fails(source: Path, tmp_path: Path, *needles: str, error=DatasetFormatError) -> str:
    dest = tmp_path / "out" / "s.h5"
    with pytest.raises(error) as info:
        import_rlds(source, dest, progress=False)
    message = str(info.value)
    for needle in needles:
        assert needle in message, (needle, message)
    assert not dest.exists()
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []
    return message


def _rewrite(shard: Path, change) -> None:
    """Rewrite a shard with ``change(index, features)`` applied to each parsed record
    (framing and CRCs recomputed, so only the content is wrong)."""
    records = []
    for i, record in enumerate(iter_records(shard)):
        features = parse_example(record)
        change(i, features)
        records.append(serialize_example(features))
    write_records(shard, records)


def test_a_flipped_byte_fails_its_crc(copy, tmp_path):
    shard = copy / SHARDS[1].name
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40
    shard.write_bytes(bytes(data))
    _fails(copy, tmp_path, shard.name, "record ", "at byte ", "CRC32C does not match")


def test_a_flipped_length_byte_fails_the_length_crc(copy, tmp_path):
    shard = copy / SHARDS[0].name
    data = bytearray(shard.read_bytes())
    data[1] ^= 0x01
    shard.write_bytes(bytes(data))
    _fails(copy, tmp_path, shard.name, "record 0 at byte 0", "length's CRC32C")


def test_a_truncated_shard(copy, tmp_path):
    shard = copy / SHARDS[1].name
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    _fails(copy, tmp_path, shard.name, "truncated", "record ")


def test_a_shard_cut_at_a_record_boundary(copy, tmp_path):
    shard = copy / SHARDS[1].name
    records = list(iter_records(shard))
    write_records(shard, records[:-1])
    _fails(copy, tmp_path, shard.name, f"{len(records) - 1} episodes", "dataset_info.json lists")


def test_a_corrupted_jpeg(copy, tmp_path):
    shard = copy / SHARDS[0].name

    def change(i, features):
        if i == 1:
            image = bytearray(features["steps/observation/image"][2])
            image[:4] = b"\0\0\0\0"  # no JPEG start-of-image marker
            features["steps/observation/image"][2] = bytes(image)

    _rewrite(shard, change)
    _fails(
        copy,
        tmp_path,
        shard.name,
        "episode 1 (record 1 of the shard)",
        "'steps/observation/image' step 2",
        "cannot be decoded",
    )


def test_a_truncated_jpeg(copy, tmp_path):
    shard = copy / SHARDS[1].name

    def change(i, features):
        if i == 0:
            features["steps/observation/image"][0] = features["steps/observation/image"][0][:300]

    _rewrite(shard, change)
    _fails(copy, tmp_path, shard.name, "'steps/observation/image' step 0", "cannot be decoded")


def test_a_step_feature_of_the_wrong_length(copy, tmp_path):
    shard = copy / SHARDS[1].name

    def change(i, features):
        if i == 2:
            features["steps/action"] = features["steps/action"][:-7]  # one step short

    _rewrite(shard, change)
    message = _fails(copy, tmp_path, shard.name, "'steps/action'", "wrong length")
    assert "episode 4" in message  # 2 episodes in shard 0, then record 2 of shard 1


def test_a_step_feature_missing_from_an_episode(copy, tmp_path):
    shard = copy / SHARDS[0].name
    _rewrite(shard, lambda i, f: f.pop("steps/observation/state") if i == 0 else None)
    _fails(copy, tmp_path, shard.name, "episode 0", "'steps/observation/state'", "0 steps")


def test_a_tensor_with_bad_zlib_bytes(copy, tmp_path):
    shard = copy / SHARDS[0].name

    def change(i, features):
        if i == 0:
            features["steps/observation/tactile"][1] = b"not zlib"

    _rewrite(shard, change)
    _fails(copy, tmp_path, "'steps/observation/tactile' step 1", "zlib")


def test_text_that_is_not_utf8(copy, tmp_path):
    shard = copy / SHARDS[0].name

    def change(i, features):
        if i == 1:
            features["steps/language_instruction"][0] = b"\xff\xfe"

    _rewrite(shard, change)
    _fails(copy, tmp_path, shard.name, "episode 1", "'steps/language_instruction'", "UTF-8")


def test_a_missing_episode_feature(copy, tmp_path):
    shard = copy / SHARDS[1].name
    _rewrite(shard, lambda i, f: f.pop("episode_metadata/file_path") if i == 1 else None)
    _fails(copy, tmp_path, shard.name, "episode 3", "'episode_metadata/file_path'", "missing")


def test_missing_features_json(copy, tmp_path):
    (copy / "features.json").unlink()
    _fails(copy, tmp_path, str(copy / "features.json"), "missing")
    _fails(copy.parent, tmp_path, str(copy / "features.json"), "missing")  # the parent folder


def test_unreadable_features_json(copy, tmp_path):
    (copy / "features.json").write_text("{not json")
    _fails(copy, tmp_path, "features.json", "cannot be read as JSON")


def test_features_json_without_steps(copy, tmp_path):
    features = json.loads((copy / "features.json").read_text())
    del features["featuresDict"]["features"]["steps"]
    (copy / "features.json").write_text(json.dumps(features))
    _fails(copy, tmp_path, "features.json", "no 'steps'")


def test_a_feature_a_store_cannot_hold(copy, tmp_path):
    features = json.loads((copy / "features.json").read_text())
    steps = features["featuresDict"]["features"]["steps"]["sequence"]["feature"]
    steps["featuresDict"]["features"]["action"]["tensor"]["shape"]["dimensions"] = ["-1"]
    (copy / "features.json").write_text(json.dumps(features))
    _fails(copy, tmp_path, "'action'", "dynamic shape", error=UnsupportedError)


def test_a_missing_shard(copy, tmp_path):
    (copy / SHARDS[1].name).unlink()
    _fails(copy, tmp_path, SHARDS[1].name, "missing", "2 shards")


def test_a_folder_that_is_no_dataset(tmp_path):
    (tmp_path / "empty").mkdir()
    _fails(tmp_path / "empty", tmp_path, "not a TFDS dataset")
    with pytest.raises(FileNotFoundError):
        import_rlds(tmp_path / "nowhere", tmp_path / "s.h5", progress=False)


def test_a_failed_import_keeps_the_store_it_would_replace(copy, tmp_path):
    dest = import_rlds(FIXTURE, tmp_path / "keep.h5", progress=False)
    before = dest.read_bytes()
    shard = copy / SHARDS[1].name
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(DatasetFormatError, match="truncated"):
        import_rlds(copy, dest, overwrite=True, progress=False)
    assert dest.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.h5", "src"]


# ---------------------------------------------------------------------------------------
# the transport: TFRecord framing and the Example wire format


def _field(number: int, wire: int, payload: bytes) -> bytes:
    from torchstore.io.records.tfrecord import _encode_varint

    if wire == 2:
        payload = _encode_varint(len(payload)) + payload
    return _encode_varint(number << 3 | wire) + payload


def _example(entries: list[tuple[bytes, bytes]]) -> bytes:
    """An Example of map entries given as (key bytes, Feature bytes)."""
    body = b"".join(_field(1, 2, _field(1, 2, k) + _field(2, 2, f)) for k, f in entries)
    return _field(1, 2, body)


def test_examples_roundtrip_every_kind(tmp_path):
    rng = np.random.default_rng(3)
    values = {
        "f": rng.standard_normal(1000).astype(np.float32),
        "small": rng.integers(0, 2, 300),
        "wide": rng.integers(-(2**62), 2**62, 2000),  # long varints: the compiled loop
        "few": np.array([-1, 2**63 - 1, -(2**63), 300]),  # short list: Python's loop
        "b": [b"", b"x" * 200, rng.bytes(70_000)],  # 1-, 2- and 3-byte lengths
        "empty": np.array([], np.float32),
    }
    path = tmp_path / "x.tfrecord"
    assert write_records(path, [serialize_example(values)] * 2) == 2
    for record in iter_records(path):
        got = parse_example(record)
        assert got.keys() == values.keys()
        for key, want in values.items():
            if isinstance(want, list):
                assert got[key] == want
            else:
                assert got[key].dtype == (np.float32 if want.dtype.kind == "f" else np.int64)
                np.testing.assert_array_equal(got[key], want)
    assert parse_example(serialize_example(values), keys={"f"}).keys() == {"f"}


def test_examples_in_the_layouts_protobuf_allows():
    import struct

    unpacked_floats = _field(2, 2, b"".join(_field(1, 5, struct.pack("<f", v)) for v in (1.5, -2)))
    unpacked_ints = _field(3, 2, _field(1, 0, b"\x05") + _field(1, 0, b"\xac\x02"))
    two_chunks = _field(
        2, 2, _field(1, 2, struct.pack("<f", 1)) + _field(1, 2, struct.pack("<f", 2))
    )
    unknown = _field(9, 0, b"\x01") + _field(1, 2, _field(1, 2, b"v"))  # a field tf never writes
    data = _example(
        [
            (b"a", unpacked_floats),
            (b"b", unpacked_ints),
            (b"c", two_chunks),
            (b"d", _field(1, 2, _field(1, 2, b"old"))),
            (b"d", _field(1, 2, _field(1, 2, b"new"))),  # a key given twice: the last wins
            (b"e", unknown),
            (b"f", b""),  # a Feature with no list set
        ]
    )
    got = parse_example(data + _field(7, 0, b"\x01"))  # an unknown top-level field too
    np.testing.assert_array_equal(got["a"], [1.5, -2])
    np.testing.assert_array_equal(got["b"], [5, 300])
    np.testing.assert_array_equal(got["c"], [1, 2])
    assert got["d"] == [b"new"]
    assert got["e"] == [b"v"]
    assert got["f"] == []


@pytest.mark.parametrize(
    "data",
    [
        _example([(b"a", _field(2, 2, _field(1, 2, b"\0\0\0")))]),  # 3 bytes of float
        _example([(b"a", _field(3, 2, _field(1, 2, b"\x80")))]),  # a varint cut short
        _example([(b"a", _field(1, 2, b"\x0a\x05ab"))]),  # a string past its list
        b"\x0a\xff\xff\xff\xff\x0f",  # a length past the message
        b"\x0f",  # wire type 7
    ],
)
def test_malformed_examples_are_refused(data):
    with pytest.raises(DatasetFormatError, match="not a valid tf.train.Example"):
        parse_example(data)


# ---------------------------------------------------------------------------------------
# the judge itself: only where tensorflow_datasets imports (tests/formats/tfds_venv.sh)


def test_a_fresh_tfds_dataset_imports_as_tfds_decodes_it(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    from tests.formats.make_rlds_fixture import tfds_values, write_dataset

    version_dir = write_dataset(
        tmp_path / "data", lengths=(6, 1, 3, 9), image=(24, 40, 3), wrist=(8, 8, 3), shards=3
    )
    assert sorted(p.name for p in version_dir.glob("*.tfrecord-*")) == [
        f"rlds_tiny-train.tfrecord-0000{i}-of-00003" for i in range(3)
    ]
    want = tfds_values(version_dir)
    for images in ("keep", "decode"):
        out = import_rlds(
            version_dir.parent, tmp_path / f"{images}.h5", progress=False, images=images
        )
        assert_matches(out, want)
