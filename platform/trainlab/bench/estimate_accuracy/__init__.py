"""`trainlab bench estimate`: the estimator against what this CPU machine measures, trial by trial."""
