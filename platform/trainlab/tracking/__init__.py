"""Trackers: MLflow (rank 0, batched; imported only where used), the trial run's lifecycle and the
sweep's parent run. The Tracker protocol and the no-op and JSONL trackers are vocabulary
(trainlab.vocab.tracker): the engine logs through them without importing tracking."""
