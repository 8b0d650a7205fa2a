"""The engine: a Trainer built from a TrialPlan (forward_backward_step -> train_step -> train),
checkpoints, resume, rollback, elastic resizing; it runs under torchrun alone (no Ray, no MLflow)."""
