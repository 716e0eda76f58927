"""Camera frames: codecs, video containers and the encoders' threads.

:mod:`.codec` is an encoded image column's codec layer (``FrameCodec``: AV1 and H.264 as bare
packets in :mod:`.codec_video`, PNG/JPEG/raw per frame in :mod:`.codec_images`, LeRobot MP4s
demuxed and muxed without a re-encode in :mod:`.codec_mp4`); :mod:`.video` is LeRobot's MP4
camera files (:mod:`.video_encode` encodes, :mod:`.video_container` probes and copies
packets); :mod:`.background_encoder` keeps a recorder off the codec's clock; and
:mod:`.scheduling` undoes the realtime scheduling that native encoders give their threads.
This is where a frame is encoded or decoded.

It knows pixels, packets and containers (through PyAV); it must not know stores, columns'
files or episodes' bookkeeping (``torchstore.data`` keeps packets in a store), nor HDF5,
HTTP or record formats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.io.frames.codec import (
        EncodedFrames,
        FrameCodec,
        FrameDecoder,
        FrameEncoder,
        StreamInfo,
        decode_frames,
        encode_frames,
    )
    from torchstore.io.frames.video import EncoderSettings, VideoFrameReader, encode_video

_EXPORTS = {
    "EncodedFrames": ".codec",
    "FrameCodec": ".codec",
    "FrameDecoder": ".codec",
    "FrameEncoder": ".codec",
    "StreamInfo": ".codec",
    "decode_frames": ".codec",
    "encode_frames": ".codec",
    "EncoderSettings": ".video",
    "VideoFrameReader": ".video",
    "encode_video": ".video",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "EncodedFrames",
    "FrameCodec",
    "FrameDecoder",
    "FrameEncoder",
    "StreamInfo",
    "decode_frames",
    "encode_frames",
    "EncoderSettings",
    "VideoFrameReader",
    "encode_video",
]
