"""Training of the relational transformer: the run's configuration tree (`config`), the jitted step (`step`) and
the loop (`loop`: checkpoints, resume, validation, logs). Optimizer, checkpoints and logs come from the toolkit."""
