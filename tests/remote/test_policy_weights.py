"""Policy weights: safetensors only, verified, returned as a state dict."""

from __future__ import annotations

import pytest
import torch

from torchstore.errors import IntegrityError, StoreFormatError
from torchstore.remote import fetch_policy_weights, push

st = pytest.importorskip("safetensors.torch")


def _policy(tmp_path, shards=1):
    folder = tmp_path / "policy"
    folder.mkdir()
    state = {
        "pi.weight": torch.randn(8, 4),
        "pi.bias": torch.zeros(8),
        "v.weight": torch.randn(1, 8),
    }
    keys = sorted(state)
    for s in range(shards):
        part = {k: state[k] for k in keys[s::shards]}
        st.save_file(part, str(folder / f"model-{s:05d}-of-{shards:05d}.safetensors"))
    (folder / "config.json").write_text('{"hidden": 8}')
    return folder, state


@pytest.mark.parametrize("shards", [1, 3])
def test_fetch_returns_the_state_dict(file_server, tmp_path, shards):
    folder, state = _policy(tmp_path, shards)
    push(folder, file_server.url, "reach-policy", kind="policy", progress=False)
    got = fetch_policy_weights(file_server.url, "reach-policy", cache_dir=tmp_path / "c")
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)
    # only the weights were fetched, not the config
    assert not file_server.gets("reach-policy/config.json")
    # offline: answered from the cache
    again = fetch_policy_weights(
        file_server.url, "reach-policy", cache_dir=tmp_path / "c", offline=True
    )
    assert all(torch.equal(again[k], state[k]) for k in state)


def test_fetch_from_a_hub_model_repo(hub, tmp_path):
    pytest.importorskip("huggingface_hub")
    folder, state = _policy(tmp_path)
    location = f"hf://models/{hub.namespace}"
    push(folder, location, "pi", kind="policy", progress=False)
    got = fetch_policy_weights(location, "pi", cache_dir=tmp_path / "c")
    assert all(torch.equal(got[k], state[k]) for k in state)


def test_pickle_weights_are_refused(file_server, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    torch.save({"w": torch.zeros(2)}, folder / "model.pt")
    with pytest.raises(
        StoreFormatError, match=r"needs at least one .safetensors file \(only pickle"
    ):
        push(folder, file_server.url, "old", kind="policy", progress=False)
    assert file_server.puts == []
    push(folder, file_server.url, "old", kind="assets", progress=False)  # published some other way
    with pytest.raises(
        StoreFormatError, match=r"has only pickle-based weights \(\['model.pt'\]\); .* refused"
    ):
        fetch_policy_weights(file_server.url, "old", cache_dir=tmp_path / "c")
    with pytest.raises(
        StoreFormatError,
        match="weights file 'model.pt' of 'old': pickle-based weights .* are refused",
    ):
        fetch_policy_weights(file_server.url, "old", filename="model.pt", cache_dir=tmp_path / "c")
    with pytest.raises(
        StoreFormatError,
        match="weights file 'w.onnx' of 'old': only .safetensors weights are loaded",
    ):
        fetch_policy_weights(file_server.url, "old", filename="w.onnx", cache_dir=tmp_path / "c")
    assert not file_server.gets("old/model.pt")  # never even downloaded


def test_missing_weights_file(file_server, tmp_path):
    folder, _ = _policy(tmp_path)
    push(folder, file_server.url, "p", kind="policy", progress=False)
    with pytest.raises(StoreFormatError, match="has no file 'x.safetensors'"):
        fetch_policy_weights(
            file_server.url, "p", filename="x.safetensors", cache_dir=tmp_path / "c"
        )


def test_tampered_weights_are_refused(file_server, tmp_path):
    folder, _ = _policy(tmp_path)
    push(folder, file_server.url, "p", kind="policy", progress=False)
    file_server.flip_byte["p/model-00000-of-00001.safetensors"] = 200
    with pytest.raises(
        IntegrityError, match="'model-00000-of-00001.safetensors' of 'p' .*sha256 mismatch"
    ):
        fetch_policy_weights(file_server.url, "p", cache_dir=tmp_path / "c")


def test_shards_repeating_a_tensor_are_refused(file_server, tmp_path):
    folder = tmp_path / "dup"
    folder.mkdir()
    st.save_file({"w": torch.zeros(2)}, str(folder / "a.safetensors"))
    st.save_file({"w": torch.ones(2)}, str(folder / "b.safetensors"))
    push(folder, file_server.url, "dup", kind="policy", progress=False)
    with pytest.raises(
        StoreFormatError,
        match=r"'b.safetensors' of 'dup' repeats tensors of another shard: \['w'\]",
    ):
        fetch_policy_weights(file_server.url, "dup", cache_dir=tmp_path / "c")
