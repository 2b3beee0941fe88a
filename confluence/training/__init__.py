"""Training of the relational transformer: optimizer, schedule, train step, loop, checkpoints, presets."""
