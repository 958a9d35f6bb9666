"""pgqueue's version: the one place it is written. The build reads it for the package's
metadata (pyproject.toml's [tool.hatch.version]), and `pgqueue --version` prints it."""

__version__ = "0.1.0"
