"""Qwen3.5's multimodal rotary positions for the Megatron language model (plain torch, no megatron).

Each token has a (temporal, height, width) position. Text tokens count up on all three axes alike
(so a text-only sequence has ordinary RoPE positions); the tokens of one image take the image's
merged patch grid, offset by the position where the image starts, and the text after it resumes
at that start plus the larger side of the grid. The rotary frequencies interleave the axes
(frequency i reads the height position when i % 3 == 1 and i < 3 * section[1], the width position
when i % 3 == 2 and i < 3 * section[2], the temporal one otherwise): transformers' Qwen3.5 and
vLLM's layout, which megatron-core's `MultimodalRotaryEmbedding` (contiguous sections) is not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def mrope_positions(
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    *,
    image_token_id: int,
    spatial_merge_size: int,
) -> torch.Tensor:
    """[3, batch, seq] positions of right-padded `input_ids` whose image-token runs take the grids
    of `image_grid_thw` ([images, 3], in row order) one by one. Padding continues the text count
    (causal attention never lets a real token see it)."""
    batch, length = input_ids.shape
    positions = torch.empty(3, batch, length, dtype=torch.long)
    grids = [] if image_grid_thw is None else [tuple(int(v) for v in g) for g in image_grid_thw.tolist()]
    next_grid = 0
    ids = input_ids.cpu()
    for row in range(batch):
        is_image = (ids[row] == image_token_id).tolist()
        start, pos = 0, 0
        while start < length:
            end = start
            while end < length and is_image[end] == is_image[start]:
                end += 1
            if not is_image[start]:
                positions[:, row, start:end] = torch.arange(pos, pos + end - start)
                pos += end - start
            else:
                if next_grid >= len(grids):
                    raise ValueError(f"row {row} has more image-token runs than the {len(grids)} image grids given")
                t, h, w = grids[next_grid]
                next_grid += 1
                h, w = h // spatial_merge_size, w // spatial_merge_size
                if end - start != t * h * w:
                    raise ValueError(
                        f"row {row}: an image-token run of {end - start} tokens for a grid of {t}x{h}x{w} merged patches"
                    )
                grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
                positions[:, row, start:end] = grid.reshape(3, -1) + pos
                pos += max(h, w)
            start = end
    if next_grid != len(grids):
        raise ValueError(f"{len(grids)} image grids given, {next_grid} image-token runs in the batch")
    return positions.to(input_ids.device)


class InterleavedMRope(torch.nn.Module):
    """Rotary angles [seq, batch, 1, rotary_dim] from [3, batch, seq] positions, called as
    megatron-core's GPTModel calls its 'mrope' embedding. `inv_freq` is the language model's own
    (its RoPE base and partial rotary dimension); kept as a plain fp32 attribute, not a buffer, so
    the model's bf16 cast and state dict leave it alone."""

    def __init__(self, inv_freq: torch.Tensor, mrope_section: Sequence[int]) -> None:
        super().__init__()
        self.inv_freq = inv_freq.float()
        half = self.inv_freq.numel()
        if len(mrope_section) != 3:
            raise ValueError(f"mrope_section {list(mrope_section)} must have 3 parts (temporal, height, width)")
        axis = torch.zeros(half, dtype=torch.long)
        index = torch.arange(half)
        for dim in (1, 2):
            axis[(index % 3 == dim) & (index < 3 * mrope_section[dim])] = dim
        self.axis = axis

    def forward(self, position_ids: torch.Tensor, mrope_section: Sequence[int] | None = None, **_: object) -> torch.Tensor:
        del mrope_section  # fixed at construction
        inv_freq = self.inv_freq.to(position_ids.device)
        freqs = position_ids.float()[..., None] * inv_freq  # [3, batch, seq, half]
        picked = freqs.gather(0, self.axis.to(position_ids.device).expand(1, *freqs.shape[1:])).squeeze(0)
        angles = torch.cat((picked, picked), dim=-1)  # [batch, seq, rotary_dim], rotate-half layout
        return angles.transpose(0, 1).unsqueeze(2).contiguous()
