"""The Megatron backend with images on a real GPU (skipped without CUDA or megatron-bridge; CI has
neither): the tiny-vl preset's Qwen3.5-MoE vision-language checkpoint, transformers' vision tower in
front of the Megatron language model (`vision_tower`), driven by the same `Actor` as the torch
backend. Log-probs with images against transformers' own model on the same weights, log-probs that
follow the image, an update that trains the tower (or not, `actor.freeze_vision_tower`), the
tower in the weight sync and in the strict HF export.

Run there: `bash bench/gpu_session.sh tests` (docs/benchmarks.md quotes the printed differences).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import grpo_device
from grpo_tiny import task as tiny_task
from grpo_tiny import vl_model as tiny_vl_model
from grpo_tiny import vl_task as tiny_vl_task
from grpo_trainer.backends.megatron import megatron_available

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages/trainer/tests/megatron"))
import local_megatron

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(not megatron_available(), reason="megatron-bridge is not installed"),
]

ROWS = 4


def _cfg(model_path: Path, *, freeze: bool):
    from grpo_config.schema import ActorConfig, DataConfig, DeviceConfig, TrainerConfig

    megatron = local_megatron.local_megatron_config(grouped_experts=True)
    actor = ActorConfig(
        model_path=str(model_path),
        backend="megatron",
        dtype="bfloat16",
        lr=1e-2,  # Adam's first step moves each weight by ~lr: past bf16's spacing (2^-7) at 1.0 (norm weights)
        ppo_micro_batch_size_per_device=2,  # two micro-batches: the images split between them
        log_prob_micro_batch_size_per_device=2,
        use_kl_loss=False,
        freeze_vision_tower=freeze,
        megatron=megatron,
    )
    return TrainerConfig(
        actor=actor, data=DataConfig(max_prompt_length=32, max_response_length=8), device=DeviceConfig(kind="cuda")
    )


@pytest.fixture(scope="module")
def vl(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoProcessor

    from grpo_trainer.data import PromptDataset

    root = tmp_path_factory.mktemp("vl_gpu")
    model_dir = tiny_vl_model.ensure_tiny_vl_model(root / "model", texts=tiny_vl_task.corpus())
    processor = AutoProcessor.from_pretrained(model_dir)
    tiny_task.write_parquet(tiny_vl_task.make_rows(count=ROWS, seed=5, split="train"), root / "rows.parquet")
    data = PromptDataset([root / "rows.parquet"], processor.tokenizer, processor=processor, max_prompt_length=32)
    return model_dir, processor, data


def _batch(vl, images_of: list[int]):
    """Row i: prompt i with the image of prompt `images_of[i]` (same grid), a 3-token answer, right padding."""
    from grpo_trainer.protocols import PolicyBatch
    from grpo_trainer.vision import pixel_inputs

    _, processor, data = vl
    answer = processor.tokenizer("\\boxed{3}", add_special_tokens=False)["input_ids"][:3]
    rows = [data[i].prompt_ids + answer for i in range(ROWS)]
    length = max(map(len, rows)) + 2
    ids = torch.zeros(ROWS, length, dtype=torch.long)
    response = torch.zeros(ROWS, length)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        response[i, len(row) - len(answer) : len(row)] = 1
    attention = (torch.arange(length)[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
    vision = [pixel_inputs(processor.image_processor, data[j].images) for j in images_of]
    return PolicyBatch(
        input_ids=ids,
        attention_mask=attention,
        response_mask=response,
        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
        vision=vision,
    )


def _actor(model_dir: Path, *, freeze: bool):
    from grpo_trainer.backends.megatron import MegatronBackend
    from grpo_trainer.workers.actor import Actor

    cfg = _cfg(model_dir, freeze=freeze)
    return Actor.for_config(cfg, MegatronBackend.for_config(cfg, model_path=str(model_dir)))


@pytest.fixture(scope="module")
def actor(vl):
    built = _actor(vl[0], freeze=False)
    yield built
    del built
    grpo_device.empty_cache()


def _hf_log_probs(model_dir: Path, batch) -> torch.Tensor:
    from transformers import AutoModelForImageTextToText

    from grpo_trainer.vision import join_rows, token_types

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    vision = {k: v.cuda() for k, v in join_rows(batch.vision).items()}
    ids = batch.input_ids.cuda()
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            attention_mask=batch.attention_mask.cuda(),
            mm_token_type_ids=token_types(ids, model.config),
            use_cache=False,
            **vision,
        ).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.cat([lp.new_zeros(lp.shape[0], 1), lp], dim=1).cpu()


def test_log_probs_with_images_match_the_hf_model_and_follow_the_image(actor, vl) -> None:
    batch = _batch(vl, images_of=[0, 1, 2, 3])
    ours = actor.log_probs(batch)["log_probs"]
    theirs = _hf_log_probs(vl[0], batch)
    mask = batch.attention_mask[:, 1:].bool()
    diff = (ours[:, 1:] - theirs[:, 1:]).abs()[mask]
    swapped = actor.log_probs(_batch(vl, images_of=[1, 0, 3, 2]))["log_probs"]
    answer = batch.response_mask.bool()
    moved = (swapped - ours).abs()[answer]
    print(
        f"\nVL log-probs megatron vs HF (bf16, images): mean abs {diff.mean():.4f}, max abs {diff.max():.4f}; "
        f"answer log-probs moved by swapping images: max abs {moved.max():.4f}"
    )
    assert diff.mean() < 0.02 and torch.quantile(diff.float(), 0.99) < 0.15
    assert moved.max() > 1e-3  # the image reaches the language model
    # ... and only the image: the text before the first image token is the same.
    torch.testing.assert_close(swapped[:, :2], ours[:, :2], rtol=0, atol=1e-5)


def _tower(actor) -> dict[str, torch.Tensor]:
    return {n: t.float().cpu().clone() for n, t in actor.backend.named_weights() if n.startswith("model.visual.")}


def _language(actor) -> torch.Tensor:
    return next(t.float().cpu().clone() for n, t in actor.backend.named_weights() if n.endswith("embed_tokens.weight"))


def test_an_update_with_images_trains_the_tower_and_the_export_holds_it(actor, vl, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    batch = _batch(vl, images_of=[0, 1, 2, 3])
    batch.old_log_probs = actor.log_probs(batch)["log_probs"]
    before, words = _tower(actor), _language(actor)
    stats = actor.update_mini_batch(batch)
    after = _tower(actor)
    changed = sum(not torch.equal(before[n], after[n]) for n in before)
    print(f"\nVL update: loss {stats['loss']:.4f}, grad_norm {stats['grad_norm']:.4f}, tower tensors changed {changed}/{len(before)}")
    assert before and changed == len(before) and not torch.equal(words, _language(actor))

    report = actor.backend.export_hf(str(tmp_path / "export"), strict=True)
    written = {}
    for file in (tmp_path / "export").glob("*.safetensors"):
        written.update(load_file(str(file)))
    assert report.complete and report.copied_from_source == []
    for name, tensor in after.items():
        assert torch.equal(written[name].float(), tensor), name


def test_a_checkpoint_restores_the_tower_and_its_optimizer_state(actor, vl, tmp_path: Path) -> None:
    """Through grpo_ckpt: saved after an update, another update, loaded: the tower's weights and the
    log-probs with images are the saved ones, and an update from the loaded state moves the tower
    as the live one did (its Adam moments came back)."""
    from grpo_ckpt import CheckpointManager
    from grpo_trainer.workers.actor_checkpoint import load_actor, save_actor

    batch = _batch(vl, images_of=[0, 1, 2, 3])
    batch.old_log_probs = actor.log_probs(batch)["log_probs"]
    actor.update_mini_batch(batch)
    tower, before = _tower(actor), actor.log_probs(batch)["log_probs"]
    manager = CheckpointManager(tmp_path / "ckpt")
    save_actor(manager, 1, actor, contents=("model", "optimizer", "extra"), trainer_state={})
    actor.update_mini_batch(batch)
    live = _tower(actor)
    load_actor(manager, manager.latest_complete(), actor)
    assert all(torch.equal(_tower(actor)[n], tower[n]) for n in tower)
    torch.testing.assert_close(actor.log_probs(batch)["log_probs"], before, rtol=0, atol=1e-5)
    actor.update_mini_batch(batch)
    replay = _tower(actor)
    worst = max((replay[n] - live[n]).abs().max().item() for n in live)
    print(f"\nVL checkpoint: tower after the replayed update vs the live one: max abs {worst:.2e}")
    assert worst < 2e-3  # a lost Adam state would move it by ~lr (1e-2)


def test_a_frozen_tower_stays_while_the_language_model_trains(actor, vl) -> None:
    del actor  # the module's actor is built first; this one after it, in the same process
    frozen = _actor(vl[0], freeze=True)
    try:
        batch = _batch(vl, images_of=[0, 1, 2, 3])
        batch.old_log_probs = frozen.log_probs(batch)["log_probs"]
        before, words = _tower(frozen), _language(frozen)
        frozen.update_mini_batch(batch)
        after = _tower(frozen)
        assert all(torch.equal(before[n], after[n]) for n in before)
        assert not torch.equal(words, _language(frozen))
    finally:
        del frozen
        grpo_device.empty_cache()
