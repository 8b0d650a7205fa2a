"""trainlab's Hydra plugins: the Ray launcher (hydra/launcher=trainlab_ray) and sweeps/ on the search path."""
