"""decode_device="cuda": on the GPU's video decoder where there is one, else the CPU after
one warning naming why; the frames equal the CPU decoder's either way."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("av")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _camera_frames import camera_frames  # noqa: E402

from torchstore.errors import ArgumentError  # noqa: E402
from torchstore.io.frames import decode_device as decode_device_module  # noqa: E402
from torchstore.io.frames.codec import FrameCodec, FrameDecoder, encode_frames  # noqa: E402
from torchstore.io.frames.resize import FrameResize  # noqa: E402

CUDA = torch.cuda.is_available()


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each test sees the once-per-process warning again."""
    monkeypatch.setattr(decode_device_module, "_WARNED", set())


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: the GPU decodes (test_gpu_*)")
def test_without_a_gpu_cuda_decodes_on_the_cpu_after_one_warning(fresh_warnings):
    codec = FrameCodec.lerobot_av1()
    encoded = encode_frames(codec, camera_frames(6, 48, 64))
    cpu = FrameDecoder(codec, encoded.info).decode(encoded.packets)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = FrameDecoder(codec, encoded.info, device="cuda")
        FrameDecoder(codec, encoded.info, device="cuda")  # the same reason: no second line
    assert [str(w.message) for w in caught] == [
        "decode_device='cuda': no CUDA device is visible; decoding on the CPU"
    ]
    assert caught[0].category is RuntimeWarning
    assert first._impl.decoder == "libdav1d"
    assert np.array_equal(first.decode(encoded.packets), cpu)


def test_image_codecs_always_decode_on_the_cpu_without_a_warning(fresh_warnings):
    codec = FrameCodec("png")
    encoded = encode_frames(codec, camera_frames(2, 16, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FrameDecoder(codec, encoded.info, device="cuda").decode(encoded.packets)


@pytest.mark.parametrize("value", ["nvdec", "cuda:x", 0, "cpu:0"])
def test_a_bad_decode_device_is_refused_naming_it(value):
    codec = FrameCodec.lerobot_av1()
    encoded = encode_frames(codec, camera_frames(2, 16, 16))
    with pytest.raises(ArgumentError, match="decode_device"):
        FrameDecoder(codec, encoded.info, device=value)


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
def test_a_datamodule_with_cuda_decoding_trains_on_a_cpu_machine(tmp_path, fresh_warnings):
    from torchstore.data import ColumnSpec, TrajectoryStoreWriter
    from torchstore.lightning import OfflineDataModule

    path = tmp_path / "s.h5"
    columns = [
        ColumnSpec("cam", torch.uint8, (32, 48, 3), codec=FrameCodec("av1", gop=4)),
        ColumnSpec("action", torch.float32, (2,)),
    ]
    with TrajectoryStoreWriter(path, columns) as writer:
        for e in range(3):
            writer.add_episode({
                "cam": camera_frames(20, 32, 48, episode=e),
                "action": np.zeros((20, 2), np.float32),
            })  # fmt: skip
    batches = []
    for device in ("cpu", "cuda"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dm = OfflineDataModule(
                path, batch_size=8, device="cpu", resident="200KB", decode_device=device
            )
            dm.setup("fit")
            batches.append(next(iter(dm.train_dataloader())))
            dm.close()
        said = [str(w.message) for w in caught if "decode_device" in str(w.message)]
        assert len(said) == (device == "cuda")
    assert torch.equal(batches[0]["cam"], batches[1]["cam"])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["av1", "h264"])
def test_gpu_decode_matches_the_cpu_decoder(kind):
    """NVDEC's frames against libdav1d's / FFmpeg's h264 (RGB conversion and a resize
    alike): a decoder may round its colour conversion differently, never by a frame."""
    codec = FrameCodec(kind, gop=8)
    encoded = encode_frames(codec, camera_frames(24, 240, 320))
    for resize in (None, FrameResize(112, 112)):
        cpu = FrameDecoder(codec, encoded.info, resize=resize).decode(encoded.packets, first=3)
        gpu_decoder = FrameDecoder(codec, encoded.info, resize=resize, device="cuda")
        assert gpu_decoder._impl.decoder == kind  # FFmpeg's own decoder, on CUDA
        gpu = gpu_decoder.decode(encoded.packets, first=3)
        assert gpu.shape == cpu.shape
        assert np.abs(gpu.astype(np.int16) - cpu.astype(np.int16)).mean() < 1.0
