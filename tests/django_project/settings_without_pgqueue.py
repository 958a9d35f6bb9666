"""The test project's settings without PGQUEUE: pgqueue must say what to set."""

from settings import *  # noqa: F403

del PGQUEUE  # noqa: F821
