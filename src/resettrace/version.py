"""resettrace's version: the one place it is written (pyproject.toml reads it, every JSON
file resettrace writes starts with it)."""

__version__ = "0.1.0"
