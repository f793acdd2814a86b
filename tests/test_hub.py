"""Adapter files: what is written, what loads, what fails, and the Hub upload (intercepted, no network)."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil

import huggingface_hub
import pytest
import torch
from huggingface_hub import HfApi, RepoUrl
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

import hmt_adapters as ha
from hmt_adapters.saving import hub as ha_hub
from tiny import random_ids, tiny_backbone

CFG = dict(segment_length=8, sensory_length=2, memory_window=3, retrieval_dim=8)


def trained(model: ha.MemoryModel) -> ha.MemoryModel:
    with torch.no_grad():
        for p in model.memory_parameters():
            p.add_(torch.randn_like(p))
    return model.eval()


def test_only_the_adapter_is_written(tmp_path):
    model = trained(ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **CFG))
    model.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "memory_adapter.safetensors", "memory_config.json"]
    weights = load_file(tmp_path / "memory_adapter.safetensors")
    assert sorted(weights) == ["memory_init", "retrieval.key.weight", "retrieval.query.weight", "summary_prompt"]
    config = json.loads((tmp_path / "memory_config.json").read_text())
    assert config["method"] == "hmt" and config["embed_dim"] == 32 and config["base_model_type"] == "llama"


def test_loading_onto_a_backbone_of_another_width_is_a_clear_error(tmp_path):
    trained(ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **CFG)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"embed_dim 32 \(adapter\) vs 16 \(given base\)"):
        ha.MemoryModel.from_pretrained(tiny_backbone("opt"), str(tmp_path))


def test_corrupted_and_missing_files_are_clear_errors(tmp_path):
    trained(ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)).save_pretrained(tmp_path)
    (tmp_path / "memory_adapter.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match="not a readable safetensors file.*corrupted"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))
    os.remove(tmp_path / "memory_adapter.safetensors")
    with pytest.raises(FileNotFoundError, match="has no memory_adapter.safetensors"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="has no memory_config.json"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(empty))


def test_an_adapter_of_another_method_with_foreign_weights_is_refused(tmp_path):
    trained(ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **CFG)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "memory_config.json").read_text())
    rmt = ha.RMTConfig(segment_length=config["segment_length"]).to_dict()
    (tmp_path / "memory_config.json").write_text(json.dumps(rmt))
    with pytest.raises(ValueError, match="holds the weights of a 'hmt' memory adapter, but .* is for 'rmt'"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))


def test_lora_and_memory_adapters_are_saved_and_restored_together(tmp_path):
    base = get_peft_model(tiny_backbone("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model = ha.wrap_with_memory(base, "hmt", **CFG)
    lora = [n for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
    assert lora, "LoRA weights must stay trainable next to the memory parameters"
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(tmp_path)
    assert {"adapter_config.json", "adapter_model.safetensors", "memory_adapter.safetensors"} <= set(
        os.listdir(tmp_path)
    )
    assert "model.safetensors" not in os.listdir(tmp_path)
    loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path)).eval()
    ids = random_ids(2, 20)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6, rtol=1e-5)


def test_lora_weights_load_into_a_backbone_that_already_has_lora(tmp_path):
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    model = ha.wrap_with_memory(get_peft_model(tiny_backbone("llama"), lora), "rmt", segment_length=8)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    model.eval().save_pretrained(tmp_path)
    fresh = get_peft_model(tiny_backbone("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    loaded = ha.MemoryModel.from_pretrained(fresh, str(tmp_path)).eval()
    ids = random_ids(1, 20)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6, rtol=1e-5)
    other = get_peft_model(tiny_backbone("llama"), LoraConfig(r=4, target_modules=["k_proj"]))
    with pytest.raises(ValueError, match="do not fit the LoRA layers"):
        ha.MemoryModel.from_pretrained(other, str(tmp_path))


class HubRecorder:
    """HfApi methods replaced by recorders (no network): each call's keywords, and the uploaded folder's contents."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, dict]] = []
        recorder = self

        def create_repo(api, repo_id, **kwargs):
            recorder.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
            # a repo id without a namespace goes to the user's
            return RepoUrl(f"https://huggingface.co/{repo_id if '/' in repo_id else 'me/' + repo_id}")

        def create_branch(api, **kwargs):
            recorder.calls.append(("create_branch", kwargs))

        def upload_folder(api, **kwargs):
            folder = kwargs["folder_path"]
            recorder.files = sorted(os.listdir(folder))
            recorder.card = open(os.path.join(folder, "README.md")).read()
            recorder.config = json.load(open(os.path.join(folder, "memory_config.json")))
            recorder.calls.append(("upload_folder", kwargs))
            return "commit-info"

        for name, fn in (
            ("create_repo", create_repo),
            ("create_branch", create_branch),
            ("upload_folder", upload_folder),
        ):
            monkeypatch.setattr(HfApi, name, fn)

    def kwargs(self, method: str) -> dict:
        found = [kw for name, kw in self.calls if name == method]
        assert len(found) == 1, (method, self.calls)
        return found[0]


def test_push_to_hub_uploads_the_adapter_and_a_model_card(monkeypatch):
    hub = HubRecorder(monkeypatch)
    base = tiny_backbone("llama")
    base.config._name_or_path = "HuggingFaceTB/SmolLM2-135M"
    model = ha.wrap_with_memory(base, "hmt", **CFG)
    assert model.push_to_hub("me/smol-hmt") == "commit-info"
    assert hub.kwargs("create_repo")["repo_id"] == hub.kwargs("upload_folder")["repo_id"] == "me/smol-hmt"
    assert hub.files == ["README.md", "config.json", "memory_adapter.safetensors", "memory_config.json"]
    card = hub.card
    assert "library_name: hmt-adapters" in card and "base_model: HuggingFaceTB/SmolLM2-135M" in card
    assert "- hmt" in card and "| `sensory_length` | `2` |" in card and "| `memory_window` | `3` |" in card
    assert 'MemoryModel.from_pretrained(base, "me/smol-hmt")' in card
    assert (
        "from transformers import AutoModelForCausalLM\n\n"
        'base = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M")'
    ) in card
    assert 'AutoMemoryModelForCausalLM.from_pretrained("me/smol-hmt")' in card
    assert hub.config["method"] == "hmt"
    # the card lists what memory_config.json holds: not how this process ran (runtime switches)
    model.gradient_checkpointing_enable()
    model.push_to_hub("me/smol-hmt")
    assert "gradient_checkpointing" not in hub.card and "offload_activations" not in hub.card


def test_a_card_for_a_base_this_package_builds_names_its_hub_origin_and_the_code_that_builds_it():
    from hmt_adapters.backbones.pretrained import SMOLLM2_NAME
    from hmt_adapters.saving.card import render_model_card

    base = tiny_backbone("llama")
    base.config._name_or_path = SMOLLM2_NAME
    card = str(render_model_card(ha.wrap_with_memory(base, "rmt", segment_length=8), repo_id="me/smol-rmt"))
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card
    assert "import hmt_adapters\n\nbase = hmt_adapters.backbones.smollm2()[0]\nmodel = " in card
    assert "AutoModelForCausalLM" not in card


def test_push_to_hub_passes_branch_pull_request_and_commit_options_to_huggingface_hub(monkeypatch):
    hub = HubRecorder(monkeypatch)
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)
    model.push_to_hub(
        "me/rmt",
        create_pr=True,
        revision="dev",
        private=True,
        commit_message="m",
        commit_description="d",
        tags=["extra"],
    )
    assert hub.kwargs("create_repo")["private"] is True
    assert hub.kwargs("create_branch") == {"repo_id": "me/rmt", "branch": "dev", "exist_ok": True}
    upload = hub.kwargs("upload_folder")
    assert (upload["revision"], upload["create_pr"], upload["commit_message"], upload["commit_description"]) == (
        "dev",
        True,
        "m",
        "d",
    )
    assert "- extra" in hub.card
    with pytest.raises(TypeError, match=r"\['max_shard_size'\].*allowed: .*'create_pr'"):
        model.push_to_hub("me/rmt", max_shard_size="1GB")


def test_save_pretrained_with_push_to_hub_saves_and_pushes(monkeypatch, tmp_path):
    hub = HubRecorder(monkeypatch)
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)
    model.save_pretrained(
        tmp_path / "local", push_to_hub=True, repo_id="me/pushed", create_pr=True, commit_message="c"
    )
    assert sorted(os.listdir(tmp_path / "local")) == [
        "config.json",
        "memory_adapter.safetensors",
        "memory_config.json",
    ]
    upload = hub.kwargs("upload_folder")
    assert (upload["repo_id"], upload["create_pr"], upload["commit_message"]) == ("me/pushed", True, "c")
    model.save_pretrained(tmp_path / "my-adapter", push_to_hub=True)
    assert [kw["repo_id"] for name, kw in hub.calls if name == "upload_folder"][-1] == "me/my-adapter"


def test_save_pretrained_refuses_keywords_it_does_not_honour(tmp_path):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)
    with pytest.raises(ValueError, match="safetensors only; `safe_serialization` must be True, got False"):
        model.save_pretrained(tmp_path, safe_serialization=False)
    with pytest.raises(TypeError, match=r"\['max_shard_size', 'variant'\].*allowed: .*'push_to_hub'"):
        model.save_pretrained(tmp_path, max_shard_size="1GB", variant="fp16")
    with pytest.raises(ValueError, match=r"\['repo_id'\] only apply with `push_to_hub=True`"):
        model.save_pretrained(tmp_path, repo_id="me/x")
    assert not os.path.exists(tmp_path / "memory_config.json")


# ---- loading from the Hub (a real HF cache layout, offline) ---------------------------------------------------------


def hub_cache(root, repo_id: str, folder, revision: str = "main", sha: str = "a" * 40, subfolder: str = "") -> str:
    """Lay out `folder`'s files as huggingface_hub caches a download of `repo_id` at `revision`; returns the cache."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / sha / subfolder
    snapshot.mkdir(parents=True)
    for name in os.listdir(folder):
        shutil.copy(os.path.join(folder, name), snapshot / name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(sha)
    return str(root)


def lora_hmt_model(seed: int = 0) -> ha.MemoryModel:
    base = get_peft_model(
        tiny_backbone("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    model = ha.wrap_with_memory(base, "hmt", **CFG)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def test_an_adapter_with_lora_loads_by_hub_repo_id_from_the_cache_offline(tmp_path, monkeypatch):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    model = lora_hmt_model()
    model.save_pretrained(tmp_path / "saved")
    cache = hub_cache(tmp_path / "hub", "org/lora-hmt", tmp_path / "saved")
    ids = random_ids(2, 20)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        for kwargs in ({"cache_dir": cache}, {"cache_dir": cache, "local_files_only": True}):
            loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), "org/lora-hmt", **kwargs)
            assert any("lora_" in n for n, _ in loaded.named_parameters())
            torch.testing.assert_close(loaded(input_ids=ids).logits, expected, atol=1e-6, rtol=1e-5)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", cache)  # the default cache (HF_HUB_CACHE)
        loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), "org/lora-hmt")
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, atol=1e-6, rtol=1e-5)


def test_hub_revision_and_subfolder_pick_the_adapter(tmp_path):
    for name in ("main", "dev"):
        trained(
            ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8, num_memory_tokens=2)
        ).save_pretrained(tmp_path / name)
    cache = hub_cache(tmp_path / "hub", "org/rmt", tmp_path / "main")
    hub_cache(tmp_path / "hub", "org/rmt", tmp_path / "dev", revision="dev", sha="b" * 40, subfolder="adapters/rmt")
    main = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), "org/rmt", cache_dir=cache)
    dev = ha.MemoryModel.from_pretrained(
        tiny_backbone("llama"), "org/rmt", cache_dir=cache, revision="dev", subfolder="adapters/rmt"
    )
    for model, folder in ((main, "main"), (dev, "dev")):
        saved = load_file(tmp_path / folder / "memory_adapter.safetensors")
        torch.testing.assert_close(dict(model.memory.state_dict()), saved)
    with pytest.raises(FileNotFoundError, match="not in the cache \\(revision nope\\)"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), "org/rmt", cache_dir=cache, revision="nope")


def test_every_adapter_file_is_downloaded_with_the_hub_keywords(tmp_path, monkeypatch):
    lora_hmt_model().save_pretrained(tmp_path / "remote")
    requests = []

    def fake_snapshot_download(repo_id, **kwargs):
        requests.append({"repo_id": repo_id, **kwargs})
        snapshot = tmp_path / "snapshot"
        snapshot.mkdir(exist_ok=True)
        for name in os.listdir(tmp_path / "remote"):
            if any(fnmatch.fnmatch(name, p) for p in kwargs["allow_patterns"]):
                shutil.copy(tmp_path / "remote" / name, snapshot / name)
        return str(snapshot)

    monkeypatch.setattr(ha_hub, "snapshot_download", fake_snapshot_download)
    loaded = ha.MemoryModel.from_pretrained(
        tiny_backbone("llama"),
        "org/adapter",
        revision="v1",
        token="tok",
        cache_dir="/c",
        force_download=True,
        local_files_only=False,
    )
    request = requests[0]
    assert {
        k: request[k] for k in ("repo_id", "revision", "token", "cache_dir", "force_download", "local_files_only")
    } == {
        "repo_id": "org/adapter",
        "revision": "v1",
        "token": "tok",
        "cache_dir": "/c",
        "force_download": True,
        "local_files_only": False,
    }
    assert {
        "memory_config.json",
        "memory_adapter.safetensors",
        "adapter_config.json",
        "adapter_model.safetensors",
    } <= set(os.listdir(tmp_path / "snapshot"))
    assert any("lora_" in n for n, _ in loaded.named_parameters())


def test_loading_keywords_that_are_neither_hub_options_nor_config_fields_are_refused(tmp_path):
    trained(ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)).save_pretrained(tmp_path)
    with pytest.raises(
        TypeError, match=r"\['device_map'\].*allowed: .*'is_trainable'.*'local_files_only'.*'segment_length'"
    ):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path), device_map="cpu")
    with pytest.raises(ValueError, match="`revision` applies to Hub repos, but .* is a local directory"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path), revision="dev")


def test_a_mistyped_local_path_says_that_the_path_does_not_exist(tmp_path):
    for typo in (str(tmp_path / "no-such-adapter"), "./adapters/smollm2-hmtt", "../x/y/z"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            ha.MemoryModel.from_pretrained(tiny_backbone("llama"), typo)
    with pytest.raises(FileNotFoundError, match=r"not a local directory \(no such path: .*adapters/smollm2-hmtt\)"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), "adapters/smollm2-hmtt", cache_dir=str(tmp_path))
