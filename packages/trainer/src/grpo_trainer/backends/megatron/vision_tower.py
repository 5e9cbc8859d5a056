"""A vision-language checkpoint in the Megatron backend: transformers' vision tower feeding the
Megatron language model.

The derivation: docs/INTERNALS.md, `grpo_trainer.backends.megatron.vision_tower`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from grpo_ckpt.vision_language import VISION_PREFIX
from grpo_trainer.backends.megatron.mrope import InterleavedMRope, mrope_positions

log = structlog.get_logger()

VISION_ATTRIBUTE = "vision_tower"
DEFAULT_MROPE_SECTION = (11, 11, 10)  # transformers' Qwen3.5 default when the config has none


@dataclass(frozen=True, kw_only=True)
class VisionLanguage:
    """What the forward needs of a vision-language checkpoint's config."""

    image_token_id: int
    spatial_merge_size: int
    mrope_section: tuple[int, int, int]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> VisionLanguage:
        text = config["text_config"]
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(
                f"the Megatron backend's multimodal RoPE is the default type; this checkpoint's is "
                f"{rope.get('rope_type')!r}: use actor.backend=torch"
            )
        section = rope.get("mrope_section", DEFAULT_MROPE_SECTION)
        if len(section) != 3:
            raise ValueError(f"the checkpoint's mrope_section {section!r} does not have 3 parts")
        return cls(
            image_token_id=int(config["image_token_id"]),
            spatial_merge_size=int(config["vision_config"]["spatial_merge_size"]),
            mrope_section=(int(section[0]), int(section[1]), int(section[2])),
        )

    def positions(self, input_ids: torch.Tensor, vision: dict[str, torch.Tensor]) -> torch.Tensor:
        return mrope_positions(
            input_ids,
            vision.get("image_grid_thw"),
            image_token_id=self.image_token_id,
            spatial_merge_size=self.spatial_merge_size,
        )


def _language_model(chunk: torch.nn.Module) -> Any:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def attach_hook(model_path: str, vl: VisionLanguage, *, trainable: bool) -> Any:
    """A pre-wrap hook (run before the bridge's weight loading) giving every chunk the multimodal
    RoPE and the first stage's chunk the vision tower, built from the checkpoint's vision config."""

    def attach(chunks: list[torch.nn.Module]) -> list[torch.nn.Module]:
        from transformers import AutoConfig, AutoModel

        # Here, not at module level: fusions imports megatron-core, which on NPU must come after
        # MindSpeed's adaptor (`imports.import_megatron_stack`, run when the backend is built).
        from grpo_trainer.backends.megatron.fusions import rope_for_per_row_angles

        logged_rope = False
        for chunk in chunks:
            gpt = _language_model(chunk)
            gpt.position_embedding_type = "mrope"
            gpt.mrope_section = list(vl.mrope_section)
            # Not gpt.config.mrope_section: megatron-core reads it only to leave its fused slot for the
            # unfused path, with a warning, when a micro-batch has more than one row.
            rope = rope_for_per_row_angles(gpt.config)
            if rope is not None and not logged_rope:
                log.info("megatron.mrope_rotary", runs=rope)
                logged_rope = True
            gpt.rotary_pos_emb = InterleavedMRope(gpt.rotary_pos_emb.inv_freq, vl.mrope_section)
            if not gpt.pre_process:
                continue
            # The decoder input is built here (words + image rows) and scattered by the GPTModel
            # itself for a text-only micro-batch, so the embedding leaves sequence parallelism alone.
            gpt.embedding.scatter_to_sequence_parallel = False
            like = next(gpt.parameters())
            tower = AutoModel.from_config(AutoConfig.from_pretrained(model_path).vision_config)
            # Floating buffers (rotary inverse frequencies) as transformers computes them, in fp32.
            tower.fp32_buffers = {n: b.detach().clone() for n, b in tower.named_buffers() if b.is_floating_point()}
            tower.to(device=like.device, dtype=like.dtype).requires_grad_(trainable)
            gpt.add_module(VISION_ATTRIBUTE, tower)
            log.info(
                "megatron.vision_tower",
                model_path=model_path,
                params=sum(p.numel() for p in tower.parameters()),
                trained=trainable,
                source="transformers (the bridge's vision encoder needs TransformerEngine)",
            )
        return chunks

    return attach


def restore_fp32_buffers(chunks: list[torch.nn.Module]) -> None:
    """Megatron's bf16 wrapper casts every floating buffer; the tower's (rotary inverse
    frequencies) go back to the fp32 values transformers computed, as in transformers' own model."""
    for chunk in chunks:
        tower = getattr(_language_model(chunk), VISION_ATTRIBUTE, None)
        for name, value in getattr(tower, "fp32_buffers", {}).items():
            owner, _, leaf = name.rpartition(".")
            module = tower.get_submodule(owner)
            module._buffers[leaf] = value.to(module._buffers[leaf].device)


def with_vision_mapping(bridge: Any) -> None:
    """Make this `AutoBridge`'s model bridges (it makes a new one on every use) map
    `vision_tower.X` <-> `model.visual.X`, replicated over tensor-parallel ranks; other bridges
    are unchanged."""
    base = type(bridge)

    class VisionTowerBridge(base):  # type: ignore[misc, valid-type]
        @property
        def _model_bridge(self) -> Any:
            model_bridge = super()._model_bridge
            _add_vision_mapping(model_bridge)
            return model_bridge

    VisionTowerBridge.__name__ = f"{base.__name__}WithVisionTower"
    bridge.__class__ = VisionTowerBridge


def _add_vision_mapping(model_bridge: Any) -> None:
    from megatron.bridge.models.conversion.mapping_registry import MegatronMappingRegistry
    from megatron.bridge.models.conversion.param_mapping import ReplicatedMapping

    language_only = model_bridge.mapping_registry

    def registry() -> Any:
        tower = ReplicatedMapping(megatron_param=f"{VISION_ATTRIBUTE}.**", hf_param=f"{VISION_PREFIX}**")
        return MegatronMappingRegistry(*language_only().mappings, tower)

    model_bridge.mapping_registry = registry


@contextmanager
def _full_sequence(embedding: Any) -> Iterator[None]:
    """The embedding's output over the whole sequence: under sequence parallelism megatron-core
    scatters it over the tensor-parallel ranks (inside the vocab-parallel embedding), and the image
    tokens' positions index the whole sequence (found on CPU ranks at TP2: an index past the shard).
    `decoder_input` scatters the combined embeddings itself."""
    words = embedding.word_embeddings
    saved = (embedding.reduce_scatter_embeddings, embedding.scatter_to_sequence_parallel, words.reduce_scatter_embeddings)
    embedding.reduce_scatter_embeddings = embedding.scatter_to_sequence_parallel = False
    words.reduce_scatter_embeddings = False
    try:
        yield
    finally:
        embedding.reduce_scatter_embeddings, embedding.scatter_to_sequence_parallel, words.reduce_scatter_embeddings = saved


def decoder_input(chunk: torch.nn.Module, input_ids: torch.Tensor, vision: dict[str, torch.Tensor], *, image_token_id: int) -> Any:
    """[seq, batch, hidden] (scattered under sequence parallelism) word embeddings with the vision
    tower's output at the image tokens, for the first stage's chunk; None elsewhere or without
    images (the GPTModel embeds the ids itself)."""
    gpt = _language_model(chunk)
    tower = getattr(gpt, VISION_ATTRIBUTE, None)
    if tower is None or not vision:
        return None
    from megatron.core import tensor_parallel

    out = tower(vision["pixel_values"].to(device=input_ids.device, dtype=next(tower.parameters()).dtype),
                grid_thw=vision["image_grid_thw"].to(input_ids.device))
    image_embeds = out.pooler_output if hasattr(out, "pooler_output") else out
    with _full_sequence(gpt.embedding):
        words = gpt.embedding(input_ids=input_ids, position_ids=None)  # [seq, batch, hidden], whole
    # Row-major order of the image tokens = the order of the images (rows, then images in a row).
    order = (input_ids == image_token_id).reshape(-1).nonzero().squeeze(1)
    if order.numel() != image_embeds.shape[0]:
        raise ValueError(f"{order.numel()} image tokens in the micro-batch, {image_embeds.shape[0]} image embeddings")
    batch = input_ids.shape[0]
    flat = words.transpose(0, 1).reshape(-1, words.shape[-1])
    flat = flat.index_copy(0, order, image_embeds.to(flat.dtype))
    combined = flat.view(batch, -1, words.shape[-1]).transpose(0, 1).contiguous()
    if gpt.config.sequence_parallel:
        combined = tensor_parallel.scatter_to_sequence_parallel_region(combined, group=gpt.pg_collection.tp)
    return combined
