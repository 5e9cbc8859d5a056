"""Tools a model calls mid-answer (multi-turn rollouts, issue 45): each call runs in a subprocess
with a wall-clock timeout and OS limits (`sandbox`), tool calls are read from the model's text in its
chat template's format (`calls`), a plain Python function becomes a tool with a JSON schema from its
signature and docstring (`schema`), and the built-in tools are a Python interpreter and a
calculator (`builtin`). docs/TOOLS.md says what is enforced where."""
