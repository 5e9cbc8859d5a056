"""The algorithm's maths, free of workers and engines: advantages and KL (`grpo_math`), the policy
loss, reward shaping, rollout correction and the learning-rate schedule."""
