"""Hostile RLDS datasets: each malformed input is one torchstore error naming the file and
what is wrong in it (a JSON key path, a record, an episode and feature), in bounded memory,
with nothing left at the destination. The cases come from a review and from the fuzzing in
benchmarks/torture_sections/rlds_files.py (whose mutators make the bombs used here)."""

from __future__ import annotations

import json
import shutil
import struct
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.formats.refused_import import refused_import
from tests.formats.test_rlds import SHARDS, VERSION, _example, _fails, _field, _rewrite
from torchstore.errors import DatasetFormatError, UnsupportedError
from torchstore.formats import import_rlds
from torchstore.io.records.tfrecord import (
    iter_records,
    masked_crc32c,
    parse_example,
    serialize_example,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from torture_sections.rlds_files import _jpeg_bomb, _png_bomb  # noqa: E402


@pytest.fixture
def src(tmp_path) -> Path:
    target = tmp_path / "src" / "rlds_tiny" / "1.0.0"
    shutil.copytree(VERSION, target)
    return target


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _step_features(data: dict) -> dict:
    return data["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"][
        "features"
    ]


# ---------------------------------------------------------------------------------------
# TFRecord and the Example wire format


@pytest.mark.parametrize(
    "packed, want",
    [
        (b"\xff" * 9 + b"\x7f", [-1]),  # bits past 64 in the 10th byte are dropped
        (b"\x80" * 9 + b"\x02", [0]),  # only bit 64 set: nothing left of it
        (b"\x05" + b"\xff" * 9 + b"\x01" + b"\xac\x02", [5, -1, 300]),
        ((b"\xff" * 9 + b"\x7f" + b"\x80" * 9 + b"\x03") * 40, [-1, -(2**63)] * 40),  # compiled
    ],
)
def test_ten_byte_varints_keep_their_low_64_bits_as_protobuf_does(packed, want):
    data = _example([(b"a", _field(3, 2, _field(1, 2, packed)))])
    assert parse_example(data)["a"].tolist() == want


def test_an_unpacked_ten_byte_varint_keeps_its_low_64_bits():
    data = _example([(b"a", _field(3, 2, _field(1, 0, b"\xff" * 9 + b"\x7f")))])
    assert parse_example(data)["a"].tolist() == [-1]


def test_an_eleven_byte_varint_is_refused():
    data = _example([(b"a", _field(3, 2, _field(1, 2, b"\xff" * 10 + b"\x01")))])
    with pytest.raises(DatasetFormatError, match="not a valid tf.train.Example"):
        parse_example(data)


def test_a_record_claiming_2_gib_in_a_short_file_allocates_nothing(tmp_path):
    header = struct.pack("<Q", 2**31)
    path = tmp_path / "x.tfrecord"
    path.write_bytes(header + struct.pack("<I", masked_crc32c(header)) + b"\0" * 100)
    assert path.stat().st_size == 112
    tracemalloc.start()
    try:
        with pytest.raises(DatasetFormatError) as info:
            list(iter_records(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "record 0 at byte 0" in str(info.value)
    assert "claims 2147483648 bytes" in str(info.value) and "100 bytes are left" in str(info.value)
    assert peak < 2**20


def test_a_record_length_past_the_file_with_a_valid_crc_in_a_shard(src, tmp_path):
    shard = src / SHARDS[1].name
    data = bytearray(shard.read_bytes())
    first = struct.unpack_from("<Q", data, 0)[0]
    at = 16 + first  # the second record's header
    header = struct.pack("<Q", len(data))
    data[at : at + 12] = header + struct.pack("<I", masked_crc32c(header))
    shard.write_bytes(bytes(data))
    _fails(src, tmp_path, shard.name, f"record 1 at byte {at}", "truncated")


# ---------------------------------------------------------------------------------------
# dataset_info.json


@pytest.mark.parametrize(
    "lengths, needle",
    [
        (["a"], "splits[0].shardLengths[0]: the string 'a' is not a count"),
        ([-1, 3], "splits[0].shardLengths[0]: the number -1 is not a count"),
        ([True, 3], "splits[0].shardLengths[0]: the boolean true is not a count"),
        ("23", "splits[0].shardLengths: expected a JSON list, got the string '23'"),
        ([2.5, 3], "splits[0].shardLengths[0]: the number 2.5 is not a count"),
    ],
)
def test_shard_lengths_that_are_not_counts(src, tmp_path, lengths, needle):
    def change(info):
        info["splits"][0]["shardLengths"] = lengths

    _edit_json(src / "dataset_info.json", change)
    _fails(src, tmp_path, "dataset_info.json", needle)


def test_a_number_past_float_range_is_refused_when_parsed(src, tmp_path):
    text = (src / "dataset_info.json").read_text()
    (src / "dataset_info.json").write_text(text.replace('"2"', "1e400", 1))
    _fails(src, tmp_path, "dataset_info.json", "cannot be read as JSON", "1e400 is out of range")
    (src / "dataset_info.json").write_text(text.replace('"2"', "NaN", 1))
    _fails(src, tmp_path, "dataset_info.json", "NaN is not a JSON number")


@pytest.mark.parametrize(
    "splits, needle",
    [
        (5, "splits: expected a JSON list, got the number 5"),
        ([5], "splits[0]: expected a JSON object, got the number 5"),
        ([{"shardLengths": ["2"]}], "splits[0].name: missing"),
        ([{"name": ["train"]}], "splits[0].name: expected a string, got a list"),
    ],
)
def test_splits_of_the_wrong_shape(src, tmp_path, splits, needle):
    _edit_json(src / "dataset_info.json", lambda info: info.__setitem__("splits", splits))
    _fails(src, tmp_path, "dataset_info.json", needle)


@pytest.mark.parametrize(
    "template, needle",
    [
        ("{DATASET}-{SPLIT}.{FORMAT}-{SHARD_X_OF_Y}", "the unknown field '{FORMAT}'"),
        ("{DATASET.__class__}-{SHARD_X_OF_Y}", "the unknown field '{DATASET.__class__}'"),
        ("{SPLIT:>999999999}-{SHARD_X_OF_Y}", "the unknown field '{SPLIT:>999999999}'"),
        ("{0}-{SHARD_X_OF_Y}", "the unknown field '{0}'"),
        ("{DATASET-{SHARD_X_OF_Y}", "is not a file template"),
        ("../../{DATASET}-{SHARD_X_OF_Y}", "is not a file below"),
        ("/etc/{DATASET}-{SHARD_X_OF_Y}", "is not a file below"),
        ("x" * 300 + "{SHARD_X_OF_Y}", "is not a file below"),
    ],
)
def test_file_templates_that_are_not_tfds_ones(src, tmp_path, template, needle):
    def change(info):
        info["splits"][0]["filepathTemplate"] = template

    _edit_json(src / "dataset_info.json", change)
    _fails(src, tmp_path, "dataset_info.json", "splits[0].filepathTemplate", needle)


def test_a_template_with_a_folder_below_the_version_is_read(src, tmp_path, expected_lengths):
    (src / "train").mkdir()
    for shard in SHARDS:
        (src / shard.name).rename(src / "train" / shard.name.replace("rlds_tiny-train.", ""))

    def change(info):
        info["splits"][0]["filepathTemplate"] = "{SPLIT}/{FILEFORMAT}-{SHARD_X_OF_Y}"

    _edit_json(src / "dataset_info.json", change)
    from torchstore import TrajectoryStore

    with TrajectoryStore(import_rlds(src, tmp_path / "t.h5", progress=False)) as store:
        assert store.num_episodes == len(expected_lengths)


@pytest.fixture
def expected_lengths() -> np.ndarray:
    with np.load(VERSION.parent / "expected.npz") as npz:
        return npz["lengths"]


@pytest.mark.parametrize("name", ["dataset_info.json", "features.json"])
def test_json_nested_past_the_parser(src, tmp_path, name):
    (src / name).write_text("[" * 100_000 + "]" * 100_000)
    _fails(src, tmp_path, name, "nested too deeply")


@pytest.mark.parametrize("name", ["dataset_info.json", "features.json"])
def test_json_nested_past_the_depth_read(src, tmp_path, name):
    def change(data):
        data["deep"] = json.loads("[" * 150 + "]" * 150)

    _edit_json(src / name, change)
    _fails(src, tmp_path, name, "deep[0][0]", "nested deeper than 100 levels")


def test_dataset_info_that_is_not_an_object(src, tmp_path):
    (src / "dataset_info.json").write_text("[1, 2]")
    _fails(src, tmp_path, "dataset_info.json", "the top level: expected a JSON object, got a list")


# ---------------------------------------------------------------------------------------
# features.json


def test_steps_that_is_not_a_dict(src, tmp_path):
    def change(data):
        data["featuresDict"]["features"]["steps"] = ["not", "a", "feature"]

    _edit_json(src / "features.json", change)
    _fails(src, tmp_path, "features.json", "featuresDict.features.steps: expected a JSON object")


@pytest.mark.parametrize(
    "dims, needle",
    [
        (["x"], "dimensions[0]: 'x' is not a dimension"),
        (["7", "-2"], "dimensions[1]: -2 is not a dimension"),
        ([7.5], "dimensions[0]: 7.5 is not a dimension"),
        ([True], "dimensions[0]: True is not a dimension"),
        ("7", "dimensions: expected a JSON list, got the string '7'"),
    ],
)
def test_dimensions_that_are_not_dimensions(src, tmp_path, dims, needle):
    def change(data):
        _step_features(data)["action"]["tensor"]["shape"]["dimensions"] = dims

    _edit_json(src / "features.json", change)
    message = _fails(src, tmp_path, "features.json", needle)
    assert "features.action.tensor.shape" in message


def test_features_of_the_wrong_shape(src, tmp_path):
    path = src / "features.json"
    original = path.read_text()

    def set_step(key, value):
        path.write_text(original)
        _edit_json(path, lambda data: _step_features(data).__setitem__(key, value))

    set_step("action", {"pythonClassName": 5, "tensor": {}})
    _fails(src, tmp_path, "features.action.pythonClassName: expected a string")
    set_step("action", {"pythonClassName": "x.Tensor", "tensor": []})
    _fails(src, tmp_path, "features.action.tensor: expected a JSON object, got a list")
    set_step("action", {"pythonClassName": "x.Tensor", "tensor": {"dtype": {"a": 1}}})
    _fails(src, tmp_path, "features.action.tensor.dtype: {'a': 1} is not a dtype name")
    set_step("action", {"pythonClassName": "x.Tensor", "tensor": {"dtype": "bfloat16"}})
    _fails(src, tmp_path, "'bfloat16' is not a dtype tfds writes", error=UnsupportedError)
    set_step("action", {"pythonClassName": "x.Tensor", "tensor": {"encoding": 3}})
    _fails(src, tmp_path, "features.action.tensor.encoding: 3 is not an encoding")
    set_step("observation", {"pythonClassName": "x.FeaturesDict", "featuresDict": {"features": []}})
    _fails(src, tmp_path, "features.observation.featuresDict.features: expected a JSON object")
    path.write_text(original)
    _edit_json(path, lambda data: data["featuresDict"].__setitem__("features", "steps"))
    _fails(src, tmp_path, "featuresDict.features: expected a JSON object")


def test_a_declared_shape_too_large_to_hold_is_refused_before_anything_is_read(src, tmp_path):
    def change(data):
        image = _step_features(data)["observation"]["featuresDict"]["features"]["image"]
        image["image"]["shape"]["dimensions"] = ["100000", "100000", "3"]

    _edit_json(src / "features.json", change)
    _fails(src, tmp_path, "'observation/image'", "30000000000 bytes", error=UnsupportedError)


def test_names_that_collide_once_flattened(src, tmp_path):
    path = src / "features.json"
    original = path.read_text()

    def change(data):
        steps = _step_features(data)
        steps["observation/state"] = steps["action"]

    _edit_json(path, change)
    _fails(src, tmp_path, "features.json", "'observation/state' appears twice")
    path.write_text(original)

    def parent(data):
        meta = data["featuresDict"]["features"]["episode_metadata"]["featuresDict"]["features"]
        meta["file_path/x"] = meta["episode_id"]

    _edit_json(path, parent)
    _fails(src, tmp_path, "'episode_metadata/file_path' is both a feature and the parent")


# ---------------------------------------------------------------------------------------
# values: bombs and ordering


def test_a_jpeg_whose_header_claims_65000_pixels_square_is_not_decoded(src, tmp_path):
    shard = src / SHARDS[0].name

    def change(i, features):
        if i == 1:
            images = features["steps/observation/image"]
            images[2] = _jpeg_bomb(images[2])

    _rewrite(shard, change)
    _fails(src, tmp_path, "episode 1", "step 2", "(65000, 65000, 3), expected (32, 32, 3)")


def test_a_bomb_in_a_column_of_free_shape_is_refused_by_its_pixel_count(src, tmp_path):
    def change(data):
        image = _step_features(data)["observation"]["featuresDict"]["features"]["image"]
        image["image"]["shape"]["dimensions"] = ["-1", "-1", "3"]

    _edit_json(src / "features.json", change)
    _rewrite(
        src / SHARDS[0].name,
        lambda i, f: (
            f["steps/observation/image"].__setitem__(0, _jpeg_bomb(f["steps/observation/image"][0]))
            if i == 0
            else None
        ),
    )
    _fails(src, tmp_path, "episode 0", "step 0", "65000x65000 pixels, more than")


def test_a_png_whose_header_claims_65000_pixels_square(src, tmp_path):
    shard = src / SHARDS[1].name

    def change(i, features):
        if i == 0:
            features["steps/observation/wrist_image"][1] = _png_bomb()

    _rewrite(shard, change)
    _fails(
        src,
        tmp_path,
        "'steps/observation/wrist_image' step 1",
        "cannot be decoded",
        "4225000000 pixels",
    )


def test_a_zlib_bomb_is_inflated_only_as_far_as_the_shape_needs(src, tmp_path, monkeypatch):
    import torchstore.formats.rlds as rlds

    monkeypatch.setattr(rlds, "_SLAB_BYTES", 2**20)
    shard = src / SHARDS[0].name

    def change(i, features):
        if i == 0:
            features["steps/observation/tactile"][1] = zlib.compress(b"\0" * 2**28)  # 256 MiB

    _rewrite(shard, change)
    tracemalloc.start()
    try:
        _fails(src, tmp_path, "'steps/observation/tactile' step 1", "inflates to more than")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20


def test_zlib_data_cut_short(src, tmp_path):
    def change(i, features):
        if i == 0:
            blob = features["steps/observation/tactile"][0]
            features["steps/observation/tactile"][0] = blob[: len(blob) - 5]

    _rewrite(src / SHARDS[0].name, change)
    _fails(src, tmp_path, "'steps/observation/tactile' step 0", "zlib")


def test_the_earliest_failure_is_reported_though_frames_decode_ahead(src, tmp_path):
    shard = src / SHARDS[0].name

    def change(i, features):
        if i == 0:  # a frame that fails in the decode pool ...
            features["steps/observation/image"][1] = b"\xff\xd8\xff" + b"\0" * 40
        if i == 1:  # ... and, parsed after it, a step feature of the wrong length
            features["steps/action"] = features["steps/action"][:-7]

    _rewrite(shard, change)
    message = _fails(src, tmp_path, "episode 0", "'steps/observation/image' step 1")
    assert "wrong length" not in message


def test_every_mutation_of_the_torture_section_ends_cleanly(tmp_path):
    """A few dozen of the torture section's random mutations (the full count runs in
    benchmarks/torture.py): each imports or is a one-line torchstore error, nothing left."""
    import random

    from torture_sections import rlds_files

    rng = random.Random(7)
    outcomes = [rlds_files._trial(tmp_path, rlds_files._KINDS[i % 4], rng) for i in range(24)]
    bad = [(o, t[:300]) for o, t in outcomes if o not in rlds_files.GOOD]
    assert bad == []
    assert {o for o, _ in outcomes} <= rlds_files.GOOD


# ---------------------------------------------------------------------------------------
# against protobuf itself, and through the command line


def _int64_list_class():
    """protobuf's own ``Int64List`` (built from a descriptor: no TensorFlow needed)."""
    pytest.importorskip("google.protobuf")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FileDescriptorProto(name="int64_list.proto", package="t", syntax="proto3")
    message = fd.message_type.add(name="Int64List")
    message.field.add(
        name="value",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("t.Int64List"))


def test_int64_lists_read_as_protobuf_reads_them():
    """Random varint bytes, packed and unpacked, short (Python loop) and long (compiled):
    each Int64List protobuf parses gives its values here, each it refuses is refused."""
    from google.protobuf.message import DecodeError

    int64_list = _int64_list_class()
    rng = np.random.default_rng(11)
    alphabets = [np.array([0x00, 0x01, 0x02, 0x03, 0x7F, 0x80, 0xFF], np.uint8), None]
    differ = []
    for trial in range(3000):
        size = int(rng.choice([1, 2, 9, 10, 11, 12, 30, 600]))
        alphabet = alphabets[trial % 2]
        if alphabet is None:
            packed = rng.integers(0, 256, size, np.uint8).tobytes()
        else:
            packed = rng.choice(alphabet, size).tobytes()
        payload = _field(1, 2, packed) if trial % 3 else _field(1, 0, packed)
        try:
            want = list(int64_list.FromString(payload).value)
        except DecodeError:
            want = None
        try:
            got = parse_example(_example([(b"a", _field(3, 2, payload))]))["a"].tolist()
        except DatasetFormatError:
            got = None
        if got != want:
            differ.append((packed.hex(), want, got))
    assert differ == []


def _example_class():
    """protobuf's own ``tf.train.Example`` (from descriptors built here)."""
    pytest.importorskip("google.protobuf")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="example.proto", package="tf", syntax="proto3")

    def message(name, fields, oneof=None):
        m = fd.message_type.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for fname, number, kind, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=kind, label=label)
            if type_name:
                f.type_name = type_name
            if oneof:
                f.oneof_index = 0
        return m

    rep, opt = field.LABEL_REPEATED, field.LABEL_OPTIONAL
    message("BytesList", [("value", 1, field.TYPE_BYTES, rep, None)])
    message("FloatList", [("value", 1, field.TYPE_FLOAT, rep, None)])
    message("Int64List", [("value", 1, field.TYPE_INT64, rep, None)])
    lists = [("bytes_list", 1, "BytesList"), ("float_list", 2, "FloatList")]
    lists.append(("int64_list", 3, "Int64List"))
    kinds = [(n, i, field.TYPE_MESSAGE, opt, f".tf.{t}") for n, i, t in lists]
    message("Feature", kinds, oneof="kind")
    features = message(
        "Features", [("feature", 1, field.TYPE_MESSAGE, rep, ".tf.Features.FeatureEntry")]
    )
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=opt)
    entry.field.add(
        name="value", number=2, type=field.TYPE_MESSAGE, label=opt, type_name=".tf.Feature"
    )
    message("Example", [("features", 1, field.TYPE_MESSAGE, opt, ".tf.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tf.Example"))


def _as_lists(features: dict) -> dict:
    """``{key: (kind, values)}``, an empty list of any kind as one value."""
    out = {}
    for key, value in features.items():
        if isinstance(value, np.ndarray):
            value = value.astype("<f4").tobytes() if value.dtype.kind == "f" else value.tolist()
        out[key] = value if len(value) else []
    return out


def test_damaged_examples_read_as_protobuf_reads_them():
    """Examples with bytes changed, inserted or deleted: protobuf and this parser refuse
    the same ones, and every feature protobuf reads is read the same here (protobuf's upb
    parser drops a map entry holding unknown fields, which is kept here)."""
    from google.protobuf.message import DecodeError

    example = _example_class()
    bases = [
        serialize_example(
            {"a": np.arange(5, dtype=np.float32), "b": [b"xy", b"z"], "c": [1, -1, 300, 2**40]}
        ),
        serialize_example({"steps/x": np.array([0, 1, 1]), "t": [b"hello"]}),
    ]
    rng = np.random.default_rng(5)
    differ = []
    for trial in range(4000):
        data = bytearray(bases[trial % 2])
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(len(data)))
            how = trial % 3
            if how == 0:
                data[at] = int(rng.integers(256))
            elif how == 1:
                data[at:at] = rng.bytes(int(rng.integers(1, 4)))
            else:
                del data[at : at + int(rng.integers(1, 4))]
        data = bytes(data)
        try:
            parsed = example.FromString(data).features.feature
            want = {}
            for key, feature in parsed.items():
                kind = feature.WhichOneof("kind")
                want[key] = [] if kind is None else getattr(feature, kind).value
                if kind == "float_list":
                    want[key] = np.array(want[key], np.float32)
            want = _as_lists(want)
        except DecodeError:
            want = None
        try:
            got = _as_lists(parse_example(data))
        except DatasetFormatError:
            got = None
        same = (want is None) == (got is None) and (
            want is None or all(got.get(k) == v for k, v in want.items())
        )
        if not same:
            differ.append((data.hex(), want, got))
    assert differ == []


def test_a_feature_given_in_pieces_is_merged_as_protobuf_merges_it():
    floats = _field(2, 2, _field(1, 2, struct.pack("<2f", 1, 2)))
    more = _field(2, 2, _field(1, 2, struct.pack("<f", 3)))
    ints = _field(3, 2, _field(1, 0, b"\x07"))
    data = _example(
        [
            (b"a", floats + more),  # one list of a kind in two pieces: they add up
            (b"b", floats + ints),  # another kind after it: the last kind wins
            (b"c", _field(1, 2, _field(1, 2, b"x")) + _field(1, 2, _field(1, 2, b"y"))),
        ]
    )
    got = parse_example(data)
    assert got["a"].tolist() == [1, 2, 3] and got["b"].tolist() == [7]
    assert got["c"] == [b"x", b"y"]
    entry = _field(1, 2, b"d") + _field(2, 2, floats) + _field(2, 2, more)  # the value twice
    assert parse_example(_field(1, 2, _field(1, 2, entry)))["d"].tolist() == [1, 2, 3]


def test_groups_and_field_number_0_as_protobuf_reads_them():
    group = _field(9, 3, b"") + _field(1, 0, b"\x05") + _field(9, 4, b"")  # an unknown group
    data = _example([(b"a", _field(3, 2, group + _field(1, 0, b"\x06")))])
    assert parse_example(data)["a"].tolist() == [6]
    for bad in (
        _field(9, 3, b"") + _field(8, 4, b""),  # closed by another number
        _field(9, 3, b""),  # never closed
        _field(9, 3, b"") * 101 + _field(9, 4, b"") * 101,  # past protobuf's depth limit
        b"\x00\x01",  # field number 0
    ):
        with pytest.raises(DatasetFormatError, match="not a valid tf.train.Example"):
            parse_example(_example([(b"a", _field(3, 2, bad))]))


def _shard_of_112_bytes(version: Path) -> None:
    header = struct.pack("<Q", 2**31)
    (version / SHARDS[0].name).write_bytes(
        header + struct.pack("<I", masked_crc32c(header)) + b"\0" * 100
    )


def _json_change(name: str, change):
    return lambda version: _edit_json(version / name, change)


def _deep_nest(version: Path) -> None:
    (version / "features.json").write_text("[" * 100_000 + "]" * 100_000)


_CLI_CASES = {
    "shardLengths ['a']": (
        _json_change("dataset_info.json", lambda d: d["splits"][0].update(shardLengths=["a"])),
        "splits[0].shardLengths[0]: the string 'a' is not a count",
    ),
    "splits 5": (
        _json_change("dataset_info.json", lambda d: d.update(splits=5)),
        "splits: expected a JSON list",
    ),
    "unknown template field": (
        _json_change(
            "dataset_info.json",
            lambda d: d["splits"][0].update(filepathTemplate="{NAME}-{SHARD_X_OF_Y}"),
        ),
        "names the unknown field '{NAME}'",
    ),
    "steps not a dict": (
        _json_change("features.json", lambda d: d["featuresDict"]["features"].update(steps=[1])),
        "featuresDict.features.steps: expected a JSON object",
    ),
    "dimension 'x'": (
        _json_change(
            "features.json",
            lambda d: _step_features(d)["action"]["tensor"]["shape"].update(dimensions=["x"]),
        ),
        "'x' is not a dimension",
    ),
    "deep nest": (_deep_nest, "nested too deeply"),
    "record claiming 2 GiB": (_shard_of_112_bytes, "claims 2147483648 bytes"),
}


@pytest.mark.parametrize("case", sorted(_CLI_CASES))
def test_the_cli_prints_one_line_exits_1_and_leaves_no_dest(src, tmp_path, case):
    mutate, needle = _CLI_CASES[case]
    mutate(src)
    dest = tmp_path / "out" / "store.h5"
    line = refused_import(src, dest, timeout=120)
    assert needle in line, line
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []
