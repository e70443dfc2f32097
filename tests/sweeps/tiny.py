"""The tiny invariant-logreg run the sweep tests sweep over (4 clients, 4 rounds, checkpoints every 2)."""

TINY = {
    "federation.clients": 4,
    "federation.clients_per_actor": 2,
    "algorithm.name": "fcsg",
    "algorithm.local_steps": 5,
    "algorithm.first_batch": 4,
    "task.test_samples": 2000,
    "run.rounds": 4,
    "run.eval_every": 1,
    "run.checkpoint_every": 2,
}
