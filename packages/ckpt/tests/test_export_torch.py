from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

from grpo_ckpt import StrictExportError
from grpo_ckpt.export import EXPORT_MANIFEST, export_hf_torch
from grpo_tiny import hf_models  # the repository's test models (grpo-tiny, the test extra)


def _tiny_qwen3(*, tied: bool) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = hf_models.qwen3_dense_config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, max_position_embeddings=64, tie_word_embeddings=tied,
    )
    return Qwen3ForCausalLM(config).to(torch.bfloat16)


def _tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["one plus two is three"] * 4, trainers.BpeTrainer(vocab_size=40, special_tokens=["<unk>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


@pytest.mark.parametrize("tied", [True, False])
def test_torch_export_round_trips_and_records_manifest(tmp_path: Path, tied: bool) -> None:
    model = _tiny_qwen3(tied=tied)
    report = export_hf_torch(model, _tokenizer(), tmp_path / "hf")
    assert report.complete and report.model_keys_not_written == []
    assert ("lm_head.weight" in report.written) is not tied

    reloaded = Qwen3ForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.bfloat16)
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path / "hf").encode("one two") == _tokenizer().encode("one two")

    manifest = json.loads((tmp_path / "hf" / EXPORT_MANIFEST).read_text())
    assert manifest["hf_export"]["backend"] == "torch"
    weights = manifest["files"]["model.safetensors"]
    assert weights["sha256"] == hashlib.sha256((tmp_path / "hf" / "model.safetensors").read_bytes()).hexdigest()
    assert "config.json" in manifest["files"] and "tokenizer.json" in manifest["files"]


def test_torch_export_reports_a_tensor_the_files_lack(tmp_path: Path) -> None:
    """A save_pretrained that forgets a tensor (injected: what the load-back check exists to catch)."""
    model = _tiny_qwen3(tied=False)
    save = model.save_pretrained
    model.save_pretrained = lambda path: save(
        path, state_dict={k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    )

    report = export_hf_torch(model, None, tmp_path / "lenient", strict=False)
    assert report.model_keys_not_written == ["lm_head.weight"] and not report.complete
    manifest = json.loads((tmp_path / "lenient" / EXPORT_MANIFEST).read_text())
    assert manifest["hf_export"]["model_keys_not_written"] == ["lm_head.weight"]

    with pytest.raises(StrictExportError, match=r"lm_head\.weight") as info:
        export_hf_torch(model, None, tmp_path / "strict", strict=True)
    assert info.value.missing == ["lm_head.weight"]
    assert not (tmp_path / "strict" / EXPORT_MANIFEST).exists()
