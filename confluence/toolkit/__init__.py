"""The toolkit the relational model and the text model share: layers, the optimizer (one Muon) and its schedule,
the device mesh, checkpoints, typed configuration trees, scalar logs and the training progress bar."""
