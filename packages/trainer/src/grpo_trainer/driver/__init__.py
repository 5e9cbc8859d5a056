"""The driver process's side of a step: rollout modes (how a step's responses are sampled),
scoring, the rollout's data and metrics, and what a checkpoint's layout allows on resume."""
