"""Camera-like test frames: a real photograph seen by a camera that pans and zooms smoothly.

Codecs are judged on what cameras see: large smooth areas, edges, texture, and motion
that moves most pixels a little from one frame to the next. Noise defeats every codec
and a static image flatters them, so neither says anything about real data. The source
is the photograph matplotlib ships (``grace_hopper.jpg``, 512x600, no download; matplotlib
is a dev dependency). Each frame is a crop of it whose centre and size follow a smooth
path (a few slow sinusoids per axis), resampled to ``height x width`` with Pillow's
bilinear filter at sub-pixel crop positions, plus a little sensor noise. Every episode
follows a path of its own, drawn from ``(seed, episode)``, so the same call always gives
the same frames.

:func:`sim_frames` is the other kind a robot dataset holds: a simulator's renders, here the
bundled reach task's top-down camera (flat shading, anti-aliased discs for the agent and the
target, a wall) with the agent on a smooth path: large flat areas and one moving object, the
easy end for a codec, where the photograph is the hard one.

Used by ``benchmarks/cameras.py`` and, through ``sys.path``, by ``tests/io``.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["camera_frames", "sim_frames", "FRAME_SOURCES"]

_MOTIONS = 3  # sinusoids summed per axis: smooth, never periodic within an episode


@functools.lru_cache(maxsize=1)
def _photograph():
    """The sample photograph as a Pillow RGB image (cached: decoded once per process)."""
    from matplotlib import cbook
    from PIL import Image

    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as img:
        return img.convert("RGB")


def _path(rng: np.random.Generator, n: int, fps: float) -> np.ndarray:
    """``n`` values of a smooth random path in [-1, 1] (sum of slow sinusoids)."""
    t = np.arange(n) / fps
    freq = rng.uniform(0.03, 0.25, _MOTIONS)  # Hz: a camera sweeping over seconds
    phase = rng.uniform(0, 2 * np.pi, _MOTIONS)
    weight = rng.dirichlet(np.ones(_MOTIONS))
    return (weight[:, None] * np.sin(2 * np.pi * freq[:, None] * t + phase[:, None])).sum(0)


def camera_frames(
    count: int,
    height: int = 224,
    width: int = 224,
    *,
    episode: int = 0,
    seed: int = 0,
    fps: float = 30.0,
    noise: float = 1.0,
) -> np.ndarray:
    """``count`` camera-like frames, uint8 ``[count, height, width, 3]``.

    The crop covers 45-85 % of the photograph's shorter side (the zoom moves too), keeps
    the output's aspect ratio and stays inside the photograph. ``noise`` is the standard
    deviation of the added Gaussian sensor noise in 8-bit levels (0 for none).
    """
    from PIL import Image

    photo = _photograph()
    rng = np.random.default_rng([seed, episode])
    src_w, src_h = photo.size
    aspect = width / height
    short = min(src_h, src_w / aspect)  # the largest crop height that fits
    zoom = 0.65 + 0.2 * _path(rng, count, fps)  # crop height as a fraction of `short`
    px, py = _path(rng, count, fps), _path(rng, count, fps)
    out = np.empty((count, height, width, 3), np.uint8)
    for k in range(count):
        crop_h = zoom[k] * short
        crop_w = crop_h * aspect
        cx = src_w / 2 + px[k] * (src_w - crop_w) / 2
        cy = src_h / 2 + py[k] * (src_h - crop_h) / 2
        box = (cx - crop_w / 2, cy - crop_h / 2, cx + crop_w / 2, cy + crop_h / 2)
        frame = np.asarray(photo.resize((width, height), Image.BILINEAR, box=box))
        if noise:  # per frame: a whole episode of float noise would not fit in memory
            frame = frame + rng.normal(0.0, noise, frame.shape).astype(np.float32)
        out[k] = np.clip(frame, 0, 255)
    return out


def sim_frames(
    count: int,
    height: int = 224,
    width: int = 224,
    *,
    episode: int = 0,
    seed: int = 0,
    fps: float = 30.0,
) -> np.ndarray:
    """``count`` renders of the reach task's camera, uint8 ``[count, height, width, 3]``: the
    agent on a smooth path, the target still, rendered square (at most 256 pixels a side,
    the renderer's cost grows with its area; then scaled up bilinearly to the larger side,
    as a camera's upscaled stream would be) and cut to ``height x width`` around the
    centre."""
    from PIL import Image

    from torchstore.tasks.reach import render_frame

    rng = np.random.default_rng([seed, episode, 1])
    size = max(height, width)
    drawn = min(size, 256)
    top, left = (size - height) // 2, (size - width) // 2
    target = rng.uniform(-0.6, 0.6, 2)
    x, y = 0.8 * _path(rng, count, fps), 0.8 * _path(rng, count, fps)
    out = np.empty((count, height, width, 3), np.uint8)
    for k in range(count):
        frame = render_frame(np.array([x[k], y[k]]), target, drawn, 0.05)
        if drawn != size:
            frame = np.asarray(Image.fromarray(frame).resize((size, size), Image.BILINEAR))
        out[k] = frame[top : top + height, left : left + width]
    return out


#: the frame sources a benchmark can take, by name
FRAME_SOURCES = {"photo": camera_frames, "sim": sim_frames}
