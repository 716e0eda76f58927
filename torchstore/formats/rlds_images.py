"""RLDS image features kept as the JPEG / PNG bytes tfds stored: encoded store columns.

tfds keeps every frame of an ``Image`` feature as the JPEG or PNG it was given. With
``images="keep"`` (the default of :func:`~torchstore.formats.rlds.import_rlds`) a ``uint8``
image feature becomes a column with ``codec=jpeg`` or ``png`` (its ``encoding_format`` in
``features.json``, else its first frame's format) holding those bytes unchanged, so the
store takes about the space of the shards instead of the decoded frames (7.5x the shards
for 224x224 camera JPEGs at quality 90). Reads decode JPEG with TensorFlow's settings and
PNG losslessly (:mod:`torchstore.io.frames.codec_images`): the pixels tfds decodes.

Each frame is checked before it is kept:

- its header (microseconds, on the thread reading the records): the column's format and
  size, and for PNG its channels (libjpeg converts a JPEG's colours to the column's
  channels as TensorFlow does, so a grey JPEG in an RGB feature is kept);
- its body, decoded once into a scratch frame by the decoder the store's reads use (on
  the decode pool; the header alone cannot tell a truncated or corrupt JPEG): a frame
  the store keeps is one it can read, and a damaged one is refused at import with the
  message a decoding import gives, naming the shard, episode, feature and step.

A frame that fails either check is decoded as tfds decodes it
(:func:`~torchstore.formats.rlds_features.decode_frame`), which refuses it if it cannot
be decoded or has another size. One that decodes (a JPEG or GIF in a PNG feature, a
palette or 16-bit PNG, a PNG in a JPEG feature) is:

- in a PNG column: kept as a PNG of those pixels, encoded here; lossless, so reads still
  give tfds's pixels;
- in a JPEG column: no JPEG holds those pixels exactly, so the feature becomes a raw
  column instead (:class:`_KeepRaw`: the import starts over with it decoded, at most once
  per feature, and ``metadata["rlds"]["decoded_images"]`` says why).

Features that stay raw columns from the start: ``uint16`` and ``float32`` images (an
encoded column holds uint8), 4-channel JPEG features, and features whose first frame is
neither JPEG nor PNG.
"""

from __future__ import annotations

import threading

import numpy as np

from torchstore.errors import FrameCodecError
from torchstore.formats.rlds_features import Leaf, decode_frame
from torchstore.io.frames.codec import FrameCodec, StreamInfo, probe_image_bytes
from torchstore.io.frames.codec_images import ImageDecoder, encode_image

__all__ = ["IMAGE_MODES", "KeptFrames", "kept_codec"]

#: how import_rlds stores image features: their bytes as they are, or decoded to uint8
IMAGE_MODES = ("keep", "decode")


class _KeepRaw(Exception):  # noqa: N818 - a signal to start over, never seen by callers
    """A frame that a JPEG column cannot hold exactly: the import starts over with the
    feature ``name`` as a raw column (``why`` is recorded in the store's metadata)."""

    def __init__(self, name: str, why: str):
        super().__init__(why)
        self.name, self.why = name, why


def kept_codec(leaf: Leaf, first: bytes) -> tuple[FrameCodec | None, str]:
    """``(codec, "")`` of the encoded column an image feature becomes, or ``(None, why)``
    when it becomes a raw column; ``first`` is its first frame's bytes."""
    if leaf.dtype != np.uint8:
        return None, f"{leaf.dtype} frames (an encoded column holds uint8)"
    kind = leaf.encoding
    if kind not in ("jpeg", "png"):  # tfds left the format to the encoder: ask the bytes
        try:
            kind = probe_image_bytes(first).kind
        except FrameCodecError:
            return None, "its first frame is neither a JPEG nor a PNG"
    codec = FrameCodec(kind)
    try:
        codec.check_channels(leaf.shape[-1])
    except FrameCodecError as exc:
        return None, str(exc)
    return codec, ""


class KeptFrames:
    """One image feature kept as an encoded column: checks its frames and gives the bytes
    to store. :meth:`packet` and :meth:`recoded` run on the decode pool (a decoder and a
    scratch frame per thread)."""

    def __init__(self, leaf: Leaf, codec: FrameCodec, shape: tuple[int, int, int]):
        self.leaf, self.codec, self.shape = leaf, codec, shape
        self.info = StreamInfo(shape[1], shape[0], shape[2])
        self._local = threading.local()

    def fits(self, blob: bytes) -> bool:
        """Whether the header says ``blob`` decodes to one of the column's frames as it is."""
        try:
            head = probe_image_bytes(blob)
        except FrameCodecError:
            return False
        if head.kind != self.codec.kind or head.channels is None:
            return False
        if (head.height, head.width) != self.shape[:2]:
            return False
        return head.kind == "jpeg" or head.channels == self.shape[2]

    def packet(self, blob: bytes, what: str) -> bytes:
        """The bytes to keep for a frame that :meth:`fits`: ``blob`` itself once the
        store's own decoder has read all of it, else :meth:`recoded`."""
        local = self._local
        if not hasattr(local, "decoder"):
            local.decoder = ImageDecoder(self.codec, self.info)
            local.scratch = np.empty((1, *self.shape), np.uint8)
        try:
            local.decoder.decode_into([blob], local.scratch, 0)
        except FrameCodecError:
            return self.recoded(blob, what)
        return blob

    def recoded(self, blob: bytes, what: str) -> bytes:
        """A frame the column cannot keep as it is, decoded as tfds decodes it (refused
        as a decoding import refuses it) and kept as a PNG of those pixels; a JPEG column
        raises :class:`_KeepRaw`."""
        pixels = decode_frame(self.leaf, blob, np.empty(self.shape, np.uint8), what)
        if self.codec.kind != "png":
            try:
                head = probe_image_bytes(blob)
                seen = f"a {head.kind.upper()} of {head.channels or 'other'} channels"
            except FrameCodecError:
                seen = "neither a JPEG nor a PNG"
            raise _KeepRaw(self.leaf.name, f"{what} is {seen}, which a JPEG column cannot hold")
        return encode_image(self.codec, pixels)
