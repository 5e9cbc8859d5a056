"""Rollout rejection sampling options (verl's `algorithm.rollout_correction.rollout_rs`), parsed
once: `load` refuses a bad option or threshold before anything starts, and the trainer masks with
the parsed result.

An option is `<scope>_<stat>`: the statistic `stat` of the per-token log-ratio
`lr = log pi_old - log pi_rollout` (k1 = -lr, k2 = lr^2 / 2, k3 = exp(lr) - 1 - lr), per token
(`token`) or over a sequence's response tokens (`seq_sum`, `seq_mean`, `seq_max`). A k1 statistic
is kept inside [log lower, log upper]; k2 and k3 ones at or below `upper`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCOPES = ("token", "seq_sum", "seq_mean", "seq_max")
OPTIONS: tuple[str, ...] = (
    *(f"{scope}_{stat}" for scope in ("token", "seq_sum", "seq_mean") for stat in ("k1", "k2", "k3")),
    "seq_max_k2",
    "seq_max_k3",
)


def parse_is_threshold(spec: float | str) -> tuple[float, float | None]:
    """verl's `rollout_is_threshold`: a number (or numeric text) is truncated IS's cap, (cap, None);
    `"lower_upper"` is IcePop's band, (upper, lower): weights outside it are set to 0."""
    if isinstance(spec, bool):
        raise ValueError(f"rollout_is_threshold must be a number or 'lower_upper', got {spec!r}")
    text = str(spec).strip()
    lower_text, band, upper_text = text.partition("_") if isinstance(spec, str) else ("", "", text)
    try:
        upper = float(upper_text)
        lower = float(lower_text) if band else None
    except ValueError:
        raise ValueError(
            f"rollout_is_threshold {spec!r} is neither a number (truncated IS's cap, e.g. 2.0) nor "
            "'lower_upper' (IcePop's band, e.g. '0.5_2.0')"
        ) from None
    if not math.isfinite(upper) or upper <= 0 or (lower is not None and (not math.isfinite(lower) or lower <= 0)):
        raise ValueError(f"rollout_is_threshold {spec!r}: its bounds must be positive numbers")
    if lower is not None and lower > upper:
        raise ValueError(f"rollout_is_threshold {spec!r}: the lower bound is above the upper one")
    return upper, lower


@dataclass(frozen=True)
class RejectionOption:
    name: str
    scope: str  # one of SCOPES
    stat: str  # k1 | k2 | k3
    lower: float | None  # k1 only: the statistic's lower bound is log(lower)
    upper: float


def _threshold(option: str, text: str) -> tuple[float | None, float]:
    stat = option.rsplit("_", 1)[1]
    parts = text.split("_")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"rollout_rs_threshold {text!r} for {option} is not a number") from None
    if any(not math.isfinite(v) or v <= 0 for v in values):
        raise ValueError(f"rollout_rs_threshold {text!r} for {option}: thresholds must be positive")
    if stat != "k1":
        if len(values) != 1:
            raise ValueError(
                f"{option} takes one upper threshold, got {text!r} ('lower_upper' is for k1 options)"
            )
        return None, values[0]
    if len(values) == 1:
        return 1.0 / values[0], values[0]
    if len(values) != 2 or values[0] > values[1]:
        raise ValueError(f"{option} takes 'upper' or 'lower_upper' with lower <= upper, got {text!r}")
    return values[0], values[1]


def parse_rejection(options: str, thresholds: str | float | None) -> list[RejectionOption]:
    """`options` is a comma-separated list of `OPTIONS` (all must pass); `thresholds` is one value
    for all of them or one per option, comma-separated. Raises ValueError saying what is wrong."""
    names = list(dict.fromkeys(o.strip() for o in options.split(",") if o.strip()))
    unknown = [n for n in names if n not in OPTIONS]
    if unknown or not names:
        raise ValueError(
            f"unknown rollout_rs option(s) {unknown or [options]}; use a comma list of {list(OPTIONS)}"
        )
    if thresholds is None:
        raise ValueError("rollout_rs_threshold must be given when rollout_rs is set")
    texts = [t.strip() for t in str(thresholds).split(",")]
    if len(texts) == 1:
        texts = texts * len(names)
    if len(texts) != len(names):
        raise ValueError(
            f"rollout_rs_threshold has {len(texts)} values for {len(names)} options; give one or one each"
        )
    parsed = []
    for name, text in zip(names, texts, strict=True):
        scope, stat = name.rsplit("_", 1)
        lower, upper = _threshold(name, text)
        parsed.append(RejectionOption(name=name, scope=scope, stat=stat, lower=lower, upper=upper))
    return parsed
