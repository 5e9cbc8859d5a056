"""verl's multimodal rows through `PromptDataset` with a real Qwen3.5 processor (`Qwen3VLProcessor`
over the tiny-vl tokenizer, made on the fly): image tokens in the prompt ids and counted by
max_prompt_length, the images kept, bad rows reported by row and file position and skipped, and a
text-only model refused rather than trained blind."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from grpo_tiny import task as tiny_task
from grpo_tiny import vl_model as tiny_vl_model
from grpo_tiny import vl_task as tiny_vl_task
from grpo_trainer.data import PromptDataset

TOKENS_PER_IMAGE = (64 // 16) ** 2 // (2 * 2)  # 64x64 pixels, 16-pixel patches merged 2x2


@pytest.fixture(scope="module")
def processor():
    return tiny_vl_model.build_processor(tiny_vl_task.corpus(), vocab_size=48)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    rows = tiny_vl_task.make_rows(count=6, seed=0, split="train")
    rows[2]["images"] = [{"bytes": b"\x89PNG\r\n\x1a\n not an image", "path": None}]  # undecodable
    rows[4]["prompt"] = [{"role": "user", "content": "how many squares"}]  # no placeholder
    path = tmp_path_factory.mktemp("vl") / "train.parquet"
    tiny_task.write_parquet(rows, path)
    return path


def test_images_reach_the_prompt_as_image_tokens_and_bad_rows_are_counted(processor, data_file) -> None:
    data = PromptDataset([data_file], processor.tokenizer, processor=processor, max_prompt_length=64)
    assert len(data) == 4 and data.report.n_malformed == 2
    reasons = " | ".join(data.report.reasons)
    assert "row 2 (train.parquet#2): images[0] cannot be decoded" in reasons
    assert "row 4 (train.parquet#4): the prompt has 0 <image> placeholder(s) for 1 image(s)" in reasons
    image_token = processor.image_token_id
    for item in (data[i] for i in range(len(data))):
        assert item.prompt_ids.count(image_token) == TOKENS_PER_IMAGE
        assert item.image_grid_thw == ((1, 4, 4),)
        (png,) = item.images
        assert Image.open(io.BytesIO(png)).size == (64, 64)
    assert [data[i].index for i in range(4)] == [0, 1, 3, 5]


def test_max_prompt_length_counts_the_image_tokens(processor, data_file) -> None:
    data = PromptDataset([data_file], processor.tokenizer, processor=processor, max_prompt_length=64)
    longest = max(len(data[i].prompt_ids) for i in range(len(data)))
    assert longest > TOKENS_PER_IMAGE
    with pytest.raises(ValueError, match="4 overlong filtered"):
        PromptDataset([data_file], processor.tokenizer, processor=processor, max_prompt_length=TOKENS_PER_IMAGE)
    # Never truncated (that would cut the image's tokens): filtered instead, and counted.
    cut = PromptDataset(
        [data_file], processor.tokenizer, processor=processor, max_prompt_length=longest - 1, overlong="truncate_left"
    )
    assert cut.report.n_truncated == 0 and cut.report.n_filtered_overlong >= 1
    assert all(len(cut[i].prompt_ids) < longest for i in range(len(cut)))


def test_a_text_only_model_is_refused_images(processor, data_file) -> None:
    with pytest.raises(ValueError, match=r"row 0 \(train.parquet#0\) has 1 image\(s\), but the model has no image processor"):
        PromptDataset([data_file], processor.tokenizer, max_prompt_length=64)


def test_the_driver_reads_the_images_through_the_model_s_processor(tmp_path: Path, data_file) -> None:
    """The driver loads the model's processor (AutoProcessor from the checkpoint) and builds each
    prompt's vision inputs once."""
    import grpo_config
    from grpo_launch import tiny_preset
    from grpo_trainer.trainer import _Run

    model_dir = tiny_vl_model.ensure_tiny_vl_model(tmp_path / "vl_model", texts=tiny_vl_task.corpus())
    preset = tiny_preset(tmp_path / "preset")
    overrides = [f"actor.model_path={model_dir}", f"data.train_files=[{data_file}]", "data.val_files=[]", "data.max_prompt_length=64", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size_per_device=16"]
    run = _Run(grpo_config.load(preset, overrides))  # hf engine, torch backend: the images go in
    assert run.vision.processor is not None and len(run.train_data) == 4
    vision = run.vision.of(run.train_data[0])
    assert vision["image_grid_thw"].tolist() == [[1, 4, 4]] and run.vision.of(run.train_data[0]) is vision
    run.rewards.close()
    # data.image_key names the images' column (verl's data.image_key).
    table = pq.read_table(data_file)
    renamed = tmp_path / "pics.parquet"
    pq.write_table(table.rename_columns(["pics" if c == "images" else c for c in table.column_names]), renamed)
    run = _Run(grpo_config.load(preset, [*overrides, f"data.train_files=[{renamed}]", "data.image_key=pics"]))
    assert len(run.train_data) == 4 and run.train_data.report.n_malformed == 2
    assert run.vision.of(run.train_data[0])["image_grid_thw"].tolist() == [[1, 4, 4]]
    run.rewards.close()


def test_vision_inputs_reach_the_model_and_its_log_probs_follow_the_image(tmp_path: Path, processor) -> None:
    """The processor's pixels for a prompt (`vision.pixel_inputs`), joined over a batch's rows
    (`vision.join_rows`), go into the policy's forward (`token_log_probs`): the right shapes, and the
    response's log-probs change when only the image does."""
    import torch
    from transformers import AutoModelForImageTextToText

    from grpo_trainer.backends.hf_kernels import use_torch_kernels_on_cpu
    from grpo_trainer.backends.hf_model import token_log_probs
    from grpo_trainer.vision import join_rows, pixel_inputs

    use_torch_kernels_on_cpu()
    model_dir = tiny_vl_model.ensure_tiny_vl_model(tmp_path / "vl_model", texts=tiny_vl_task.corpus())
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    rows = tiny_vl_task.make_rows(count=2, seed=3, split="train")
    data_file = tmp_path / "two.parquet"
    tiny_task.write_parquet(rows, data_file)
    data = PromptDataset([data_file], processor.tokenizer, processor=processor, max_prompt_length=64)
    response = processor.tokenizer("3", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([data[0].prompt_ids + response])
    mask = torch.ones_like(ids)
    first, second = (pixel_inputs(processor.image_processor, data[i].images) for i in range(2))
    assert first["pixel_values"].shape == (16, 3 * 2 * 16 * 16) and first["image_grid_thw"].tolist() == [[1, 4, 4]]
    joined = join_rows([first, None, second])
    assert joined["pixel_values"].shape == (32, 1536) and joined["image_grid_thw"].tolist() == [[1, 4, 4]] * 2
    assert join_rows([None, None]) == {}
    with torch.no_grad():
        own, _ = token_log_probs(model, ids, mask, with_entropy=False, vision=join_rows([first]))
        swapped, _ = token_log_probs(model, ids, mask, with_entropy=False, vision=join_rows([second]))
        again, _ = token_log_probs(model, ids, mask, with_entropy=False, vision=join_rows([first]))
    answer = slice(len(data[0].prompt_ids), None)
    assert torch.equal(own, again)
    assert (own[0, answer] - swapped[0, answer]).abs().max() > 1e-4  # the same words, another image


def test_the_hf_engine_generates_from_the_image(tmp_path: Path, processor) -> None:
    """The `hf` rollout engine hands each prompt's pixels to `generate`: with the same words and
    the same seed, another image gives other log-probs (and text prompts beside it still work)."""
    from transformers import AutoModelForImageTextToText

    from grpo_trainer.backends.hf_kernels import use_torch_kernels_on_cpu
    from grpo_trainer.protocols import SamplingParams
    from grpo_trainer.rollout.hf_engine import HFRolloutEngine
    from grpo_trainer.vision import pixel_inputs

    use_torch_kernels_on_cpu()
    model_dir = tiny_vl_model.ensure_tiny_vl_model(tmp_path / "vl_model", texts=tiny_vl_task.corpus())
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    rows = tiny_vl_task.make_rows(count=2, seed=4, split="train")
    data_file = tmp_path / "two.parquet"
    tiny_task.write_parquet(rows, data_file)
    data = PromptDataset([data_file], processor.tokenizer, processor=processor, max_prompt_length=64)
    tok = processor.tokenizer
    engine = HFRolloutEngine(model=model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    params = SamplingParams(n=2, max_tokens=4, temperature=1.0, seed=5)
    images = [pixel_inputs(processor.image_processor, data[i].images) for i in range(2)]
    text_prompt = tok("squares", add_special_tokens=False)["input_ids"]
    prompts = [data[0].prompt_ids, text_prompt]
    own = engine.generate(prompts, params, vision=[images[0], None])
    other = engine.generate(prompts, params, vision=[images[1], None])
    assert [g.prompt_index for g in own] == [0, 0, 1, 1]
    assert own[0].logprobs[0] != pytest.approx(other[0].logprobs[0], abs=1e-5)
    assert own[2].token_ids == other[2].token_ids  # the text prompt's draws do not depend on row 0's image
    with pytest.raises(ValueError, match="1 vision inputs for 2 prompts"):
        engine.generate(prompts, params, vision=[images[0]])


def test_prepared_geo3k_rows_keep_their_images_and_score_as_verl(tmp_path: Path, processor) -> None:
    """geo3k as `prepare-data` writes it (images as {bytes, path} structs, `<image>` in the problem)
    reaches the processor with its image, and its reward is verl's: 0.9 x accuracy of the last
    boxed answer + 0.1 x the `<think>...</think> ... \\boxed{}` format."""
    import datasets

    from grpo_launch.prepare_data import prepare_dataset
    from grpo_trainer.rewards import get_reward_fn

    answers = ["2\\sqrt{3}", "\\frac{4}{3}", "60"]
    features = datasets.Features(
        {"images": datasets.List(datasets.Image()), "problem": datasets.Value("string"), "answer": datasets.Value("string")}
    )

    def split(offset: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {
                "images": [[Image.new("RGB", (64, 64), (40 * i, 90, 0))] for i in range(3)],
                "problem": [f"<image>Find x in triangle {offset + i}." for i in range(3)],
                "answer": answers,
            },
            features=features,
        )

    source = tmp_path / "geo3k_saved"
    datasets.DatasetDict({"train": split(0), "test": split(3)}).save_to_disk(source)
    written = prepare_dataset("geo3k", output_dir=tmp_path / "geo3k", source=str(source))
    data = PromptDataset([written["train"]], processor.tokenizer, processor=processor, max_prompt_length=512)
    assert len(data) == 3 and data.report.n_malformed == 0
    score = get_reward_fn(data[0].data_source)
    for i in range(3):
        item = data[i]
        assert item.prompt_ids.count(processor.image_token_id) == TOKENS_PER_IMAGE and len(item.images) == 1
        truth = item.ground_truth
        assert truth == answers[i]
        assert score(f"<think>the angles add up</think> so \\boxed{{{truth}}}", truth) == pytest.approx(1.0)
        assert score(f"so \\boxed{{{truth}}}", truth) == pytest.approx(0.9)  # no think block
        assert score("<think>hm</think> \\boxed{7}", truth) == pytest.approx(0.1)  # format only
        assert score(f"<think>x</think> \\boxed{{7}} then \\boxed{{{truth}}}", truth) == pytest.approx(1.0)  # the last box


@pytest.mark.parametrize("freeze", [False, True])
def test_one_update_with_images_trains_the_vision_tower_unless_frozen(tmp_path: Path, processor, freeze) -> None:
    """The torch backend loads the VL checkpoint whole and trains on a batch with pixels;
    `actor.freeze_vision_tower` (verl's key) keeps the vision tower's weights as they were."""
    import torch

    import grpo_config
    from grpo_trainer.backends.torch_backend import TorchBackend
    from grpo_trainer.batching import pad_rows
    from grpo_trainer.vision import pixel_inputs
    from grpo_trainer.workers.actor import Actor

    model_dir = tiny_vl_model.ensure_tiny_vl_model(tmp_path / "vl_model", texts=tiny_vl_task.corpus())
    rows = tiny_vl_task.make_rows(count=4, seed=6, split="train")
    tiny_task.write_parquet(rows, tmp_path / "four.parquet")
    data = PromptDataset([tmp_path / "four.parquet"], processor.tokenizer, processor=processor, max_prompt_length=64)
    cfg = grpo_config.load(
        {
            "actor": {
                "model_path": str(model_dir),
                "dtype": "float32",
                "lr": 1e-2,
                "ppo_mini_batch_size": 1,
                "ppo_micro_batch_size_per_device": 2,
                "use_kl_loss": False,
                "freeze_vision_tower": freeze,
            },
            "rollout": {"engine": "hf", "n": 4},
            "data": {"max_response_length": 4, "train_batch_size": 1},
        }
    )
    actor = Actor.for_config(cfg, TorchBackend.for_config(cfg, device=torch.device("cpu")))
    response = processor.tokenizer("12", add_special_tokens=False)["input_ids"]
    batch = pad_rows([data[i].prompt_ids for i in range(4)], [response] * 4, pad_token_id=processor.tokenizer.pad_token_id)
    batch.vision = [pixel_inputs(processor.image_processor, data[i].images) for i in range(4)]
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    batch.old_log_probs = actor.log_probs(batch)["log_probs"]
    module = actor.backend.module
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    actor.update_mini_batch(batch)
    changed = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
    assert any(n.startswith("model.language_model.") for n in changed)
    assert any(n.startswith("model.visual.") for n in changed) != freeze


def test_placeholder_ids_are_the_configs_vision_tokens_inside_the_vocabulary(tmp_path: Path) -> None:
    """A text checkpoint saved in the vision-language layout keeps transformers' default vision ids
    (248053, ...), outside a small vocabulary: those are not tokens of the model and are left out
    (vLLM refuses out-of-vocabulary ids in a logit bias)."""
    from transformers import AutoConfig

    from grpo_tiny.model import save_vision_language_layout
    from grpo_trainer.vision import placeholder_ids

    vl = AutoConfig.from_pretrained(tiny_vl_model.ensure_tiny_vl_model(tmp_path / "vl", texts=tiny_vl_task.corpus()))
    assert placeholder_ids(vl) == sorted(
        {vl.image_token_id, vl.video_token_id, vl.vision_start_token_id, vl.vision_end_token_id}
    )
    assert all(i < vl.text_config.vocab_size for i in placeholder_ids(vl))
    from grpo_launch import tiny_preset

    text_dir = tiny_preset(tmp_path / "text")["actor"]["model_path"]
    layout = AutoConfig.from_pretrained(save_vision_language_layout(Path(text_dir), tmp_path / "layout"))
    assert layout.image_token_id >= layout.text_config.vocab_size and placeholder_ids(layout) == []
