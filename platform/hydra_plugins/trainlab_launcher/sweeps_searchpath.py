"""Puts the project's sweeps/ folder on Hydra's config search path.

Sweep definitions live in sweeps/sweep/<name>.yaml, so `+sweep=<name>` selects one from any
working directory, the way Hydra users select any config group option.
"""


from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class TrainlabSweepsSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from trainlab.config.convert import SWEEPS_DIR

        search_path.append(provider="trainlab-sweeps", path=f"file://{SWEEPS_DIR}")
