"""Real training tenants: a small causal transformer trained from scratch by SFT and by GRPO."""
