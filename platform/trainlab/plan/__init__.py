"""The plan layer: `plan_trial(run, where) -> TrialPlan`, the one place a trial's device, layout,
accumulation, micro-batches, precision spec, paths and estimate are decided; the engine, the
tracker and the launcher read the plan, never re-derive it."""
