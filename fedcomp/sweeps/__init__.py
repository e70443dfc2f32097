"""Ray Tune + Optuna sweeps over whole federated runs (issue #3 builds this on top of ``fedcomp.run``)."""
