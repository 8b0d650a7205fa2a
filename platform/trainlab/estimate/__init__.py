"""Know before you run: memory and time of a trial on a cluster, from the config alone.

    est = estimate_trial(run, ClusterSpec.of_nodes(["8xH100"]))   # estimate.trial_estimate, vocab.nodes
    est.fits, est.ranks[0].memory, est.step_time_s, est.tokens_per_s, est.mfu, est.bound

Per rank, from the same decisions the engine makes (the precision's spec, the layout's
degrees, shards and pipeline stages): bytes of parameters, gradients, optimizer and FP8 state
(counted), activations and buffers (modelled); per step, compute from the model FLOPs and
the device's peak (the MFU table), communication from the bytes each collective moves over
its link, the pipeline's bubble, overlap where the layout overlaps. Efficiencies come from a
calibration fitted to recorded runs (`trainlab calibrate`), or defaults.
"""
