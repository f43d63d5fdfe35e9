"""TRL jobs (SFT, GRPO) on tiny models built from configs, taking Baton turns."""
