"""A tokenizer trained on the fly and a shrunk random-weight model of the Qwen3.5 MoE family.

`Qwen3_5MoeForCausalLM` keeps what makes the family: hybrid layers (three Gated DeltaNet linear
attention layers, then one gated full attention layer), routed experts with top-k routing and a
gated shared expert. Sizes respect what vLLM's CPU backend accepts (attention head_dim 32, linear
attention head dim 64), so the vLLM engine can serve the same checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import structlog

log = structlog.get_logger()

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
# The prompt is the user's words and the model answers right after them: no role markers, which
# the tiny model has no use for and which would cost CPU time on every token.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
SEED = 1234
# For tool conversations: the shape of Qwen3.5's template (its tool messages become a user turn of
# <tool_response> blocks), without the system prompt, thinking and tool list, which the tiny model
# does not need. End of turn: <|im_end|>, the tokenizer's EOS in `build_tokenizer(tools=True)`.
TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"


def call_tokens(function: str, parameter: str) -> tuple[str, str]:
    """A one-argument call's fixed parts in Qwen3.5's format: (opening, closing) around the value."""
    return (
        f"<tool_call>\n<function={function}>\n<parameter={parameter}>\n",
        "\n</parameter>\n</function>\n</tool_call>",
    )


# A calculator call's fixed parts, one token each in `build_tokenizer(tools=True)`, so a tiny model
# can learn to write a call: CALL_OPEN, the expression, CALL_CLOSE.
CALL_OPEN, CALL_CLOSE = call_tokens("calculator", "expression")
TOOL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tokenizer(
    texts: list[str], *, vocab_size: int, tools: bool = False, call: tuple[str, str] = (CALL_OPEN, CALL_CLOSE)
):
    """A byte-level BPE trained on `texts` with the Qwen3.5 pre-tokenizer (digits one per token),
    so `AutoTokenizer` (which picks `Qwen3_5Tokenizer` for this model type and rebuilds that
    pipeline) encodes exactly as trained. Only bytes seen in `texts` enter the vocabulary, which
    keeps it small: a random model then emits a digit often enough to be rewarded. With `tools`,
    Qwen3.5's turn markers are special tokens, <|im_end|> is the EOS, a call's fixed parts (`call`,
    the calculator's by default) are a token each and the template renders tool messages
    (`TOOL_CHAT_TEMPLATE`). A character `texts` lack is not in the vocabulary: an answer holding one
    loses it, so a tiny tool task keeps its tools' answers within its corpus."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX

    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    specials = [PAD_TOKEN, EOS_TOKEN, TURN_START, TURN_END] if tools else [PAD_TOKEN, EOS_TOKEN]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    core.train_from_iterator(texts, trainer=trainer)
    eos = TURN_END if tools else EOS_TOKEN
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD_TOKEN, eos_token=eos)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE if tools else CHAT_TEMPLATE
    if tools:  # the call's and the tool answer's fixed parts: a token each
        tokenizer.add_tokens([*call, "<tool_response>", "</tool_response>"])
    return tokenizer


def build_model(*, vocab_size: int, pad_token_id: int, eos_token_id: int, max_positions: int):
    """Random-weight `Qwen3_5MoeForCausalLM` (~1 M parameters), float32, fixed seed."""
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        max_position_embeddings=max_positions,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Qwen3_5MoeForCausalLM(config)
    return model


def ensure_tiny_model(
    model_dir: Path,
    *,
    texts: list[str],
    vocab_size: int = 48,
    tools: bool = False,
    call: tuple[str, str] = (CALL_OPEN, CALL_CLOSE),
) -> Path:
    """Build tokenizer + model into `model_dir` unless a complete one is already there (`tools`,
    `call`: the tool-calling tokenizer, `build_tokenizer`)."""
    marker = model_dir / "config.json"
    if marker.exists() and (model_dir / "tokenizer.json").exists():
        return model_dir
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    tokenizer = build_tokenizer(texts, vocab_size=vocab_size, tools=tools, call=call)
    model = build_model(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_positions=256,
    )
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if model_dir.exists():  # a partial earlier build
        import shutil

        shutil.rmtree(model_dir)
    tmp.replace(model_dir)
    log.info(
        "tiny_model.built",
        path=str(model_dir),
        vocab_size=len(tokenizer),
        parameters=sum(p.numel() for p in model.parameters()),
    )
    return model_dir


def prime_tool_calls(model_dir: Path, *, prompts: list[str] | None = None, strength: float = 3.0) -> None:
    """Lean the saved causal LM at `model_dir` towards writing calculator calls: add `strength`
    times the mean direction of its last hidden states over `prompts` (default: the tiny task's
    `repeat d` prompts) to the output rows of
    CALL_OPEN, CALL_CLOSE and the end of turn, so each becomes likely at every position. A random
    tiny model writes a whole call too rarely for a short multi-turn test; learning to call is the
    tiny-tool preset's to show."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_tiny import task

    if prompts is None:
        prompts = [f"repeat {d}" for d in task.DIGITS]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        hidden = model.model(**tokenizer(prompts, return_tensors="pt", padding=True)).last_hidden_state
        direction = hidden.mean(dim=(0, 1))
        rows = [*tokenizer.convert_tokens_to_ids([CALL_OPEN, CALL_CLOSE]), tokenizer.eos_token_id]
        model.lm_head.weight[rows] += strength * direction / direction.norm()
    model.save_pretrained(model_dir)


def save_vision_language_layout(
    text_dir: Path, out_dir: Path, *, language_weights: bool = True, seed: int = 1
) -> Path:
    """The text checkpoint at `text_dir` in Qwen3.5's real checkpoint layout
    (`Qwen3_5MoeForConditionalGeneration`: the language model under `model.language_model.*`, a
    one-layer random vision tower under `model.visual.*`), with its tokenizer: what vLLM (0.26 on
    GPU) serves, where a text-only Qwen3.5 folder does not load. With `language_weights` the
    language model's tensors are the text checkpoint's, else random (seeded)."""
    import shutil

    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        Qwen3_5MoeConfig,
        Qwen3_5MoeForConditionalGeneration,
    )

    text = AutoConfig.from_pretrained(text_dir)
    vision = {
        "depth": 1,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "out_hidden_size": text.hidden_size,
    }
    config = Qwen3_5MoeConfig(text_config=text.to_dict(), vision_config=vision, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3_5MoeForConditionalGeneration(config).to(text.dtype or torch.float32)
    if language_weights:
        # Through the modules (transformers' own layout and checkpoint conversion), not a renaming
        # rule: the text model's `model` is the language model, its `lm_head` the same head.
        text_model, info = AutoModelForCausalLM.from_pretrained(
            text_dir, dtype=text.dtype or torch.float32, output_loading_info=True
        )
        if info["missing_keys"] or info["unexpected_keys"]:
            raise ValueError(
                f"{text_dir} does not load whole: missing {sorted(info['missing_keys'])[:5]}, "
                f"unexpected {sorted(info['unexpected_keys'])[:5]}"
            )
        model.model.language_model.load_state_dict(text_model.model.state_dict(), strict=True)
        model.lm_head.load_state_dict(text_model.lm_head.state_dict(), strict=True)
    model.save_pretrained(out_dir)
    for path in Path(text_dir).iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "generation_config", "chat_template")):
            shutil.copy(path, out_dir / path.name)
    return out_dir
