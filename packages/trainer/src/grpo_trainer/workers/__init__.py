"""Ray worker actors and the driver's typed facades over them: the policy workers (actor, reference,
colocated engine), the rollout workers of one-step-off, and the worker group that runs both."""
