"""Model code and demo checkpoints."""
