"""Cross-field checks, grouped by the section they check; `grpo_config.validate` runs them all."""
