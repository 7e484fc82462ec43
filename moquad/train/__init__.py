"""Stage 2: self-supervised pre-training (losses, LARS, schedules, the training loop)."""
