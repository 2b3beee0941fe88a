"""User-facing errors: each carries a message that names the table / column / row / task at fault.

The CLI prints these without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class ConfluenceError(Exception):
    """Base class for errors caused by the user's input (data, metadata, configuration)."""


class MetadataError(ConfluenceError):
    """The metadata file is invalid. `problems` lists every problem found, each naming its culprit."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        msg = f"{len(self.problems)} problem(s) in the metadata:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(msg)


class DataError(ConfluenceError):
    """The raw data is unreadable or inconsistent with the metadata."""


class StoreError(ConfluenceError):
    """A processed store is missing, truncated, of another format version, or otherwise unreadable."""


class ConfigError(ConfluenceError):
    """A configuration setting is unknown, of the wrong type or out of range. `setting` is its dotted path in
    the configuration tree (e.g. `sampler.recent`)."""

    def __init__(self, setting: str, problem: str):
        self.setting, self.problem = setting, problem
        super().__init__(f"config setting '{setting}': {problem}" if setting else f"config: {problem}")

    def within(self, section: str) -> ConfigError:
        """The same error one level down the tree (`recent` inside `sampler` -> `sampler.recent`)."""
        return ConfigError(f"{section}.{self.setting}" if self.setting else section, self.problem)
