"""What Hydra's Optuna sweeper will try, as far as that is known before any trial runs.

    proposal = optuna_proposal(cfg.hydra.sweeper, config=cfg, arguments=task_overrides)
    proposal.overrides   # [("optim.lr=0.00347...", "precision=bf16", "model=tiny"), ...]

The sweeper (hydra-optuna-sweeper) asks an Optuna study for hydra.sweeper.n_jobs trials, launches
them, tells the study their results and asks again, until n_trials. Its search space is built here
as its OptunaSweeperImpl.sweep builds it: hydra.sweeper.params as `key=value` lines, then the
command line's task overrides; each sweep an Optuna distribution (a,b: categorical; range(...):
stepped; interval(...): uniform, tag(log, ...) log-uniform), anything else a fixed value, a fixed
value of a key dropping its sweep. The study is asked as the sweeper asks it (in memory, the
sampler instantiated from hydra.sweeper.sampler, a batch at a time), so a seeded sampler proposes
here exactly what it will propose there. Known before any trial runs:

- the GridSampler: every point of the grid (it runs min(n_trials, grid size) of them, each once,
  picked with Python's unseeded random.choice: which and in what order is left to chance);
- the RandomSampler: every trial (its draws never read a result);
- the TPESampler: every batch asked before n_startup_trials trials have results (drawn by its
  RandomSampler, whatever the results), at least the first;
- any other sampler: the first batch (no trial has a result yet when it is asked).

Unseeded, the same trials are a sample of what the sweeper could propose. trainlab never imports
the hydra_plugins namespace (the layers' app-never-imports-its-plugin contract covers every package
in it, this sweeper's too), so the few lines of the plugin's _impl.py this needs are mirrored
here with Optuna and Hydra's override parser; tests/unit/test_estimate_search_sweepers.py holds
them to the plugin's own proposals.
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

from trainlab.config.convert import ConfigError
from trainlab.config.sweep_limits import check_study_size


@dataclass(frozen=True)
class Proposal:
    overrides: list[tuple[str, ...]]
    """The trials known before any runs, as the sweeper hands them to the launcher (the searched
    params in the order of the space, then the fixed ones); a grid's in grid order."""
    num_trials: int
    """How many trials the sweeper runs in all: n_trials, for a grid at most its size."""
    note: str
    """One line saying what `overrides` are of the study."""


def search_space(lines: Sequence[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(distributions, fixed values) of `key=value` lines, read as the plugin's
    create_params_from_overrides reads them (a key keeps its last sweep and its last fixed value)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    space: dict[str, Any] = {}
    fixed: dict[str, str] = {}
    for o in OverridesParser.create().parse_overrides(list(lines)):
        if o.is_sweep_override():
            space[o.get_key_element()] = _distribution(o)
        else:
            fixed[o.get_key_element()] = o.get_value_element_as_str()
    return space, fixed


def _distribution(o: Any) -> Any:
    """The Optuna distribution of a sweep override (the plugin's create_optuna_distribution_from_override)."""
    from hydra.core.override_parser.types import Transformer
    from optuna import distributions as d

    v = o.value()
    try:
        if o.is_choice_sweep() or (o.is_range_sweep() and v.shuffle):
            choices = list(o.sweep_iterator(transformer=Transformer.encode))
            bad = [c for c in choices if not isinstance(c, (str, int, float, bool, type(None)))]
            if bad:
                raise ConfigError(f"{o.input_line}: Optuna's choices are strings, numbers, booleans or null, not "
                                  f"{bad[0]!r}; sweep {o.get_key_element()} over values of one of those kinds")
            return d.CategoricalDistribution(choices)
        if o.is_range_sweep():
            if any(isinstance(x, float) for x in (v.start, v.stop, v.step)):
                return d.DiscreteUniformDistribution(v.start, v.stop, v.step)
            return d.IntUniformDistribution(int(v.start), int(v.stop), step=int(v.step))
        if o.is_interval_sweep():
            ints = isinstance(v.start, int) and isinstance(v.end, int)
            if "log" in v.tags:
                return d.IntLogUniformDistribution(v.start, v.end) if ints else d.LogUniformDistribution(v.start, v.end)
            return d.IntUniformDistribution(v.start, v.end) if ints else d.UniformDistribution(v.start, v.end)
    except ValueError as e:  # Optuna's own check of the bounds (low above high, a step of 0, a log low end <= 0)
        raise ConfigError(_bounds_message(o, str(e))) from None
    raise ConfigError(f"{o.input_line}: Hydra's Optuna sweeper takes a,b,c, range(...) and interval(...) "
                      f"sweeps; sweep {o.get_key_element()} with one of those")


def _bounds_message(o: Any, why: str) -> str:
    """Optuna's refusal of a sweep's bounds as one line with the sweep that works: an interval's ends
    in order; a log interval's low end above 0 (its high end / 1e4, 1 for integers)."""
    key, v = o.get_key_element(), o.value()
    if not o.is_interval_sweep():
        return f"{o.input_line}: {why.rstrip('.')}; give {key} bounds low <= high"
    low, high, log = v.start, v.end, "log" in v.tags

    def written(lo, hi, *, tagged=log):
        return f"{key}=tag(log,interval({lo:g},{hi:g}))" if tagged else f"{key}=interval({lo:g},{hi:g})"
    if low > high:
        return (f"{o.input_line}: its low end {low:g} is above its high end {high:g}; give them in order: "
                f"{written(high, low)}")
    if log and low <= 0:
        smallest = 1 if isinstance(low, int) and isinstance(high, int) else high / 1e4  # an int interval stays one
        fix = f"give one, e.g. {written(smallest, high)}" if high > 0 else "give both ends above 0"
        return f"{o.input_line}: a log interval needs a low end above 0 (its logarithm is drawn), not {low:g}; {fix}"
    return f"{o.input_line}: {why.rstrip('.')}; give {key} bounds low <= high"


def grid_choices(key: str, distribution: Any) -> list:
    """The values the GridSampler takes for a key (the plugin's _to_grid_sampler_choices: a range
    stops before its end, as Hydra's range does)."""
    from optuna import distributions as d

    if isinstance(distribution, d.CategoricalDistribution):
        return list(distribution.choices)
    if isinstance(distribution, d.IntUniformDistribution):
        n = (distribution.high - distribution.low) // distribution.step
        return [distribution.low + i * distribution.step for i in range(n)]
    if isinstance(distribution, d.DiscreteUniformDistribution):
        n = int((distribution.high - distribution.low) // distribution.q)
        return [distribution.low + i * distribution.q for i in range(n)]
    raise ConfigError(f"{key}: the GridSampler (hydra/sweeper/sampler=grid) takes only discrete sweeps, not an "
                      f"interval; sweep {key} with a comma list (a,b,c) or range(...), or choose another sampler "
                      "(hydra/sweeper/sampler=tpe)")


def optuna_proposal(sweeper: Any, *, config: Any, arguments: Sequence[str]) -> Proposal:
    """The trials of Hydra's Optuna sweeper node `sweeper` known before any runs (module docstring).
    `config`: the multirun's composed config (what a custom_search_space function is handed);
    `arguments`: the command line's task overrides, as Hydra hands them to the sweeper."""
    import functools

    import optuna
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from optuna.samplers import TPESampler

    from trainlab.config.study_rule import sweeper_info

    if sweeper.get("params") is None and sweeper.get("search_space"):
        raise ConfigError("hydra.sweeper.search_space is Hydra's deprecated form of the search space; write it as "
                          "hydra.sweeper.params (e.g. optim.lr: interval(1e-4,1e-2)) to have its trials listed")
    lines = [f"{k!s}={v}" for k, v in (sweeper.get("params") or {}).items()] + list(arguments)
    space, fixed = search_space(lines)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = instantiate(sweeper.sampler)
            custom = sweeper.get("custom_search_space")
            extend = instantiate({"_target_": custom, "_partial_": True}) if custom else None
    except InstantiationException as e:
        raise ConfigError(f"hydra.sweeper.sampler ({sweeper.sampler.get('_target_')}): "
                          f"{str(e).splitlines()[0]}; fix its keys as Optuna's sampler takes them") from None
    info = sweeper_info(sweeper)
    n_trials, n_jobs = int(sweeper.n_trials), int(sweeper.n_jobs)
    for key, n in (("n_trials", n_trials), ("n_jobs", n_jobs)):
        if n < 1:  # the sweeper would run no trial (n_trials) or ask batches of none (n_jobs)
            raise ConfigError(f"hydra.sweeper.{key}={n}: the study needs at least 1; give "
                              f"hydra.sweeper.{key}={'20' if key == 'n_trials' else '2'} (the default)")
    grid = isinstance(sampler, functools.partial) and sampler.func is optuna.samplers.GridSampler
    if grid:  # as the sweeper: the grid of every swept key (a fixed one's too), then n_trials capped
        choices = {k: grid_choices(k, dist) for k, dist in space.items()}
        sampler = sampler(choices)
        size = math.prod(len(c) for c in choices.values())
        n_trials = min(n_trials, size)
    for key in fixed:  # a fixed value beats a sweep of the same key
        space.pop(key, None)
    launcher = config.hydra.get("launcher") if config is not None and "hydra" in config else None
    try:  # the trials it runs, against the launcher's bound (grid: at most its size)
        check_study_size(n_trials, asked=int(sweeper.n_trials),
                         max_trials=launcher.get("max_trials") if launcher is not None else None)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if grid:
        want, why = size, ""
    else:
        want, why = _known_trials(sampler, sweeper.sampler, n_trials=n_trials, n_jobs=n_jobs)
    trials = _ask(sampler, directions=list(info.directions) or ["minimize"], study_name=sweeper.get("study_name"),
                  n_trials=size if grid else n_trials, n_jobs=n_jobs, want=want, space=space, fixed=fixed,
                  extend=extend, config=config)
    if grid:  # in the order the basic sweeper would list them (the sweeper's own is random)
        trials.sort(key=lambda t: [choices[k].index(t[0][k]) for k in space])
    overrides = [o for _, o in trials]
    note = _note(f"hydra/sweeper={info.name} ({type(sampler).__name__}", grid=grid, seed=info.seed,
                 listed=len(overrides), n_trials=n_trials, asked=int(sweeper.n_trials), why=why,
                 keys=list(space), reads_results=type(sampler) is TPESampler)
    if sweeper.get("storage") is not None:
        note += "; listed as a fresh study: trials already in hydra.sweeper.storage would change them"
    return Proposal(overrides=overrides, num_trials=n_trials, note=note)


def _note(head: str, *, grid: bool, seed: int | None, listed: int, n_trials: int, asked: int, why: str,
          keys: list[str], reads_results: bool) -> str:
    """The line saying what the listed trials are of the study (`head`: the sweeper and its sampler)."""
    if grid and listed == n_trials:
        return (f"{head}): all {listed} trials are knowable before they run, the grid of "
                f"{' x '.join(keys) or 'no swept key'}; the sweeper runs them in a random order")
    if grid:
        return (f"{head}): it runs {n_trials} of these {listed} grid points (hydra.sweeper.n_trials={asked}), "
                f"picked at random; all {listed} are listed")
    if seed is None:
        return (f"{head}, unseeded): these {listed} of its {n_trials} trials are a sample of what it could propose "
                "first: unseeded, every run draws others; set hydra.sweeper.sampler.seed=0 to make them its own")
    if listed == n_trials:
        return f"{head}, seed {seed}): all {n_trials} trials are knowable before they run ({why})"
    if why:
        return (f"{head}, seed {seed}): its first {listed} of {n_trials} trials are knowable before they run "
                f"({why}); the later ones depend on the results")
    return (f"{head}, seed {seed}): its first batch of {listed} of {n_trials} trials is knowable before they run; "
            f"later batches {'depend' if reads_results else 'may depend'} on the results")  # TPE past its start reads them


def _known_trials(sampler: Any, node: Any, *, n_trials: int, n_jobs: int) -> tuple[int, str]:
    """How many of the sweeper's first trials no result can change, and why (module docstring)."""
    from optuna.samplers import RandomSampler, TPESampler

    first = min(n_jobs, n_trials)
    if type(sampler) is RandomSampler:
        return n_trials, "its draws never read a result"
    if type(sampler) is TPESampler and not node.get("constant_liar"):  # a liar counts running trials too
        startup = int(node.get("n_startup_trials", 10))
        known = min(n_trials, math.ceil(startup / n_jobs) * n_jobs)  # batches asked before `startup` results
        if known > first:
            return known, f"drawn at random until n_startup_trials={startup} trials have results"
    return first, ""


def _ask(sampler: Any, *, directions: list[str], study_name: Any, n_trials: int, n_jobs: int, want: int,
         space: dict[str, Any], fixed: dict[str, str], extend: Any, config: Any) -> list[tuple[dict, tuple[str, ...]]]:
    """The first `want` trials (their params, their overrides), asked of an in-memory study batch by batch as the
    sweeper asks (each told a placeholder result: within `want` none is read), as its
    _configure_trials writes them."""
    import optuna
    from optuna.trial import TrialState

    verbosity, state = optuna.logging.get_verbosity(), random.getstate()  # the GridSampler draws from `random`
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory ..."
    out: list[tuple[dict, tuple[str, ...]]] = []
    try:
        study = optuna.create_study(study_name=study_name, sampler=sampler, directions=directions)
        while len(out) < min(want, n_trials):
            batch = [study.ask() for _ in range(min(n_jobs, n_trials - len(out)))]
            for trial in batch:
                for name, distribution in space.items():
                    trial._suggest(name, distribution)  # the sweeper's own call (suggest_* may round a step)
                for name, value in fixed.items():
                    trial.set_user_attr(name, value)
                if extend is not None:
                    extend(config, trial)
                overlap = trial.params.keys() & trial.user_attrs
                if overlap:
                    raise ConfigError(f"hydra.sweeper.custom_search_space suggests {sorted(overlap)}, which the "
                                      "command line or hydra.sweeper.params fix; drop one of the two")
                params = dict(trial.params)
                out.append((params, tuple(f"{k}={v}" for k, v in {**params, **fixed}.items())))
            for trial in batch:
                try:
                    study.tell(trial, state=TrialState.COMPLETE, values=[0.0] * len(directions))
                except RuntimeError as e:  # a grid exhausted stops its study: the sweeper passes it over too
                    if "Study.stop" not in str(e):
                        raise
    finally:
        optuna.logging.set_verbosity(verbosity)
        random.setstate(state)
    return out[:want]

