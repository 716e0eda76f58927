"""Eager CPU fast paths of the prioritized step write what the general paths write."""

from __future__ import annotations

import torch
from test_device import _check_rows, _replay

from torchstore.samplers import PrioritizedSampler
from torchstore.samplers.device import PhiloxSampler, empty_batch, sample_into, update_priority_


def test_a_reused_packed_batch_follows_replaced_leaves():
    # the packed batch's blocks are remembered between calls; a leaf the caller replaces
    # (or another batch) must still get the drawn rows
    storage = _replay()
    packed, plain = empty_batch(storage, 16, packed=True), empty_batch(storage, 16)
    for _ in range(2):
        sample_into(storage, PhiloxSampler(seed=3), packed)
        sample_into(storage, PhiloxSampler(seed=3), plain)
        assert all(torch.equal(packed[k], plain[k]) for k in plain.keys())
    packed.set("obs", torch.zeros_like(packed["obs"]))  # no longer a view into the block
    other = empty_batch(storage, 16, packed=True)
    sample_into(storage, PhiloxSampler(seed=9), packed)
    sample_into(storage, PhiloxSampler(seed=9), other)
    sample_into(storage, PhiloxSampler(seed=9), plain)
    for batch in (packed, other):
        assert all(torch.equal(batch[k], plain[k]) for k in plain.keys())
        _check_rows(batch)


def test_the_eager_prioritized_step_tracks_the_largest_priority():
    storage = _replay()
    sampler = PrioritizedSampler(64, seed=1)
    sampler.update_priority(torch.arange(40), torch.linspace(0.1, 2.0, 40))
    out = empty_batch(storage, 8, packed=True)
    sample_into(storage, sampler, out)
    assert bool((out["priority_weight"] > 0).all()) and bool((out["priority_weight"] <= 1).all())
    update_priority_(sampler, out["index"], torch.full((8,), 5.0))
    assert sampler.default_priority == 5.0
    update_priority_(sampler, out["index"], torch.full((8,), 3.0))
    assert sampler.default_priority == 5.0
    assert torch.equal(sampler._raw[out["index"]], torch.full((8,), 3.0, dtype=torch.float64))
