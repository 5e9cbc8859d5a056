"""The `algorithm` section: ranges, combinations verl refuses or that learn nothing."""

from __future__ import annotations

from grpo_config.rejection import parse_is_threshold, parse_rejection
from grpo_config.rules.common import (
    LOG_PROB_SETTINGS,
    NotYet,
    Range,
    changed_fields,
    not_yet_problems,
    range_problems,
)
from grpo_config.schema import (
    ActorConfig,
    TrainerConfig,
)

RANGES: tuple[Range, ...] = (
    ("algorithm.adv_eps", lambda v: v > 0, "> 0 (added to the group's standard deviation), e.g. 1e-6"),
    ("algorithm.kl_ctrl.kl_coef", lambda v: v >= 0, ">= 0"),
    ("algorithm.kl_ctrl.horizon", lambda v: v >= 1, ">= 1 sequences"),
    ("algorithm.kl_ctrl.target_kl", lambda v: v > 0, "> 0"),
)

NOT_YET: tuple[NotYet, ...] = (
    (
        "algorithm.kl_penalty",
        "full",
        "the full KL needs both models' whole vocabulary distributions at every token, which neither "
        "grpo nor verl keeps; use kl (k1, verl's default here), low_var_kl (k3), mse (k2) or abs",
    ),
)


def algorithm_problems(cfg: TrainerConfig) -> list[str]:
    """Ranges; settings of one algorithm set while that algorithm is off (accepted and ignored
    otherwise), and combinations with no defined meaning."""
    algorithm = cfg.algorithm
    problems = range_problems(cfg, RANGES) + not_yet_problems(cfg, NOT_YET)
    if algorithm.use_kl_in_reward and algorithm.kl_penalty.endswith("+"):
        problems.append(
            f"algorithm.kl_penalty={algorithm.kl_penalty}: a '+' estimator differs from its base only in the "
            f"gradient, and a reward has none. Use {algorithm.kl_penalty[:-1]}."
        )
    groups = algorithm.filter_groups
    if groups.enable and groups.metric == "seq_final_reward" and algorithm.use_kl_in_reward:
        problems.append(
            "algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true: groups are "
            "filtered before the log-prob passes that the KL penalty needs. Filter on seq_reward or acc."
        )
    correction = algorithm.rollout_correction
    if correction.bypass_mode and (correction.rollout_is is not None or correction.rollout_rs is not None):
        problems.append(
            "algorithm.rollout_correction.bypass_mode=true with rollout_is / rollout_rs is not implemented: grpo's "
            "weights and rejections act on the gap between the old log-probs and the engine's, which bypass mode "
            "makes the same tensor (verl weights pi_theta / pi_rollout there instead). Remove rollout_is / "
            "rollout_rs, or set bypass_mode=false (the old log-probs recomputed)."
        )
    if correction.bypass_mode and not cfg.uses_reference_model:
        unread = changed_fields(cfg.actor, ActorConfig(), LOG_PROB_SETTINGS, "actor")
        if unread:
            problems.append(
                f"{', '.join(unread)}: read by the policy's log-prob pass, which bypass_mode=true skips, and no "
                "reference model runs one (no KL loss, no KL in the reward). Remove them or set bypass_mode=false."
            )
    logprobs_mode = cfg.rollout.engine_kwargs.get("logprobs_mode", "raw_logprobs")
    if correction.bypass_mode and cfg.rollout.engine == "vllm" and logprobs_mode != "raw_logprobs":
        problems.append(
            f"algorithm.rollout_correction.bypass_mode=true with rollout.engine_kwargs.logprobs_mode={logprobs_mode}: "
            "those log-probs are of the distribution after temperature / top-k / top-p, the policy's in the "
            "loss are of the raw one. Use raw_logprobs (vLLM's default) or set bypass_mode=false."
        )
    try:
        parse_is_threshold(correction.rollout_is_threshold)
    except ValueError as exc:
        problems.append(f"algorithm.rollout_correction.{exc}.")
    if correction.rollout_rs is not None:
        try:
            parse_rejection(correction.rollout_rs, correction.rollout_rs_threshold)
        except ValueError as exc:
            problems.append(f"algorithm.rollout_correction: {exc}.")
    return problems


def no_signal_problems(cfg: TrainerConfig) -> list[str]:
    """Settings under which every group's responses score alike, so nothing is learned: said
    first, since they are the cause of what other checks may find."""
    problems = []
    if cfg.rollout.n < 2:
        problems.append(
            f"rollout.n={cfg.rollout.n} with algorithm.adv_estimator={cfg.algorithm.adv_estimator}: the advantage is a "
            f"response's reward against the other responses to its prompt, so with one response there "
            f"is nothing to compare and nothing is learned. Set rollout.n >= 2 (the recipes use 5 or 6)."
        )
    if cfg.rollout.temperature == 0:
        problems.append(
            f"rollout.temperature=0 samples greedily: the {cfg.rollout.n} responses to a prompt are the same, "
            f"so each group's rewards are equal, every advantage of algorithm.adv_estimator="
            f"{cfg.algorithm.adv_estimator} is 0 and nothing is learned. Set rollout.temperature > 0 (the "
            "recipes use 1.0); validation stays greedy unless rollout.val_do_sample=true."
        )
    return problems
