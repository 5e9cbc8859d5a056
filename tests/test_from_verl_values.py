"""from-verl over the values a Hydra override can carry (issue 43, point 2), as a property: for
override lines built from verl keys and every value form (plain and quoted strings, numbers and
numbers written as strings, booleans, nulls, lists, mappings, interpolations, empty values),
`convert` never raises, its YAML loads back, and each line is mapped, inert or refused exactly once.

`GRPO_FROM_VERL_EXAMPLES` sets the number of examples (CI: 150; the issue's check: 10000)."""

from __future__ import annotations

import os

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_config.from_verl import convert

KEYS = [
    "algorithm.adv_estimator",
    "algorithm.use_kl_in_reward",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.train_files",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.strategy",
    "actor_rollout_ref.ref.strategy",
    "actor_rollout_ref.actor.ppo_micro_batch_size",
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "trainer.n_gpus_per_node",
    "trainer.resume_mode",
    "actor_rollout_ref.actor.megatron.param_offload",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode",
    "++actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs",
    "trainer.logger",
    "trainer.total_epochs",
    "trainer.project_name",
    "model_engine",
    "+some.unknown.key",
]
WORDS = st.sampled_from(["grpo", "megatron", "fsdp2", "vllm", "FULL_DECODE_ONLY", "none", "True", "1e-6", "0.5", "8", "a b"])
SCALARS = st.one_of(
    WORDS,
    st.integers(-3, 4096).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    WORDS.map(lambda w: f'"{w}"'),
    WORDS.map(lambda w: f"'{w}'"),
    st.sampled_from(["null", "~", "", "true", "False", "${actor_rollout_ref.model.path}", "${oc.env:HOME}"]),
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
    st.dictionaries(st.sampled_from(["a", "b", "mode"]), SCALARS, max_size=2).map(
        lambda d: "{" + ",".join(f"{k}:{v}" for k, v in d.items()) + "}"
    ),
    st.sampled_from(["[1, 2", "{a: ", "'unterminated", '"x'])  # broken: refused with the reason
)
LINES = st.lists(st.tuples(st.sampled_from(KEYS), VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"), min_size=1, max_size=6)
EXAMPLES = int(os.environ.get("GRPO_FROM_VERL_EXAMPLES", "150"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LINES)
def test_any_override_values_map_or_are_refused_and_the_yaml_loads_back(lines: list[str]) -> None:
    conversion = convert(lines)
    loaded = yaml.safe_load(conversion.to_yaml())
    assert loaded is None or isinstance(loaded, dict)
    judged = [
        *[line for line in conversion.accepted if line not in conversion.inferred],
        *(line for line, _ in conversion.inert),
        *(line for line, _ in conversion.refused),
    ]
    last = {line.partition("=")[0].lstrip("+"): line for line in lines}  # a key given twice: its last line
    assert sorted(judged) == sorted(last.values())
    assert all(reason for _, reason in conversion.refused)
    refused = {line for line, _ in conversion.refused}
    assert {line for line in last.values() if "${" in line} <= refused  # Hydra would resolve it; grpo cannot
