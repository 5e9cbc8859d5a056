"""The Megatron backend's multimodal RoPE against transformers' Qwen3.5 on CPU: the positions
(`mrope_positions` vs `get_rope_index`) and the interleaved rotary angles (`InterleavedMRope` vs
the text rotary embedding). The decoder input with images is tested in
test_ckpt_export_qwen35.py (a Megatron model built on the CPU); the Megatron forward itself needs a
GPU (megatron-core allocates on CUDA): tests/test_vl_megatron_gpu.py, run on the H200.
"""

from __future__ import annotations

import pytest
import torch

from grpo_tiny import vl_model as tiny_vl_model
from grpo_tiny import vl_task as tiny_vl_task
from grpo_trainer.backends.megatron.mrope import InterleavedMRope, mrope_positions


@pytest.fixture(scope="module")
def hf_vl(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForImageTextToText

    path = tiny_vl_model.ensure_tiny_vl_model(tmp_path_factory.mktemp("vl") / "model", texts=tiny_vl_task.corpus())
    return path, AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()


def _batch(config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two right-padded rows: one image of 1x8x8 patches (16 tokens) between text; two images
    (1x4x12 patches = 12 tokens, then 1x4x4 = 4 tokens) in the second."""
    start, end, image = config.vision_start_token_id, config.vision_end_token_id, config.image_token_id

    def span(tokens: int) -> list[int]:
        return [start, *[image] * tokens, end]

    row0 = [5, 6, 7, *span(16), 8, 9]
    row1 = [5, *span(12), 10, 11, *span(4), 12, 13, 14, 15]
    length = max(len(row0), len(row1)) + 3
    ids = torch.zeros(2, length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, tokens in enumerate((row0, row1)):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
    return ids, mask, torch.tensor([[1, 8, 8], [1, 4, 12], [1, 4, 4]])


def test_mrope_positions_are_transformers_positions(hf_vl) -> None:
    from grpo_trainer.vision import token_types

    _, model = hf_vl
    config = model.config
    ids, mask, grids = _batch(config)
    expected, _ = model.model.get_rope_index(
        ids, mm_token_type_ids=token_types(ids, config), image_grid_thw=grids, attention_mask=mask
    )
    ours = mrope_positions(
        ids, grids, image_token_id=config.image_token_id, spatial_merge_size=config.vision_config.spatial_merge_size
    )
    real = mask.bool()
    assert torch.equal(ours[:, real], expected[:, real])
    assert not torch.equal(ours[0], ours[1])  # the image tokens' positions are 3-D
    text_only = mrope_positions(ids[:, :2] * 0 + 5, None, image_token_id=config.image_token_id, spatial_merge_size=2)
    assert torch.equal(text_only, torch.arange(2).expand(3, 2, 2))
    with pytest.raises(ValueError, match="4 image grids given, 3 image-token runs"):
        mrope_positions(ids, torch.cat([grids, grids[:1]]), image_token_id=config.image_token_id, spatial_merge_size=2)
    with pytest.raises(ValueError, match="row 1 has more image-token runs than the 2 image grids"):
        mrope_positions(ids, grids[:2], image_token_id=config.image_token_id, spatial_merge_size=2)
    with pytest.raises(ValueError, match="row 0: an image-token run of 16 tokens for a grid of 1x2x2"):
        mrope_positions(ids, grids.flip(0), image_token_id=config.image_token_id, spatial_merge_size=2)


def test_interleaved_mrope_angles_are_transformers_rotary(hf_vl) -> None:
    _, model = hf_vl
    rotary = model.model.language_model.rotary_emb
    ids, _, grids = _batch(model.config)
    positions = mrope_positions(ids, grids, image_token_id=model.config.image_token_id, spatial_merge_size=2)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    ours = InterleavedMRope(rotary.inv_freq, rotary.mrope_section)(positions)  # [seq, batch, 1, dim]
    angles = ours.squeeze(2).transpose(0, 1)
    assert angles.shape == cos.shape
    torch.testing.assert_close(angles.cos(), cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(angles.sin(), sin, rtol=0, atol=1e-6)
    # Not megatron-core's contiguous sections, which give this model's 4 frequencies (sections
    # 11/11/10) all to the temporal axis: the image tokens' height / width positions tell them apart.
    contiguous = positions[0][..., None].float() * rotary.inv_freq
    assert not torch.allclose(torch.cat((contiguous, contiguous), -1).cos(), cos)
