"""Command-line interface (`confluence ...`). Each area registers its commands from its own module."""
