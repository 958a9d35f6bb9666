"""`python -m tests.django_suite [pytest options]`: Django's task tests on pgqueue's backend.

DJANGO_SDIST_CACHE names the folder the sdist is kept in (default .pgqueue/django-sdist)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import django
import pytest

from tests.django_suite import plugin, source

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    cache = Path(os.environ.get("DJANGO_SDIST_CACHE", ROOT / ".pgqueue" / "django-sdist"))
    archive = source.sdist(django.get_version(), cache)
    with tempfile.TemporaryDirectory(prefix="django-task-tests-") as folder:
        tests = source.extract_task_tests(archive, Path(folder))
        sys.path.insert(0, str(tests))  # Django's test modules import as `tasks`
        files = [str(tests / "tasks" / name) for name in source.TEST_FILES]
        options = ["-c", str(ROOT / "pyproject.toml"), "-p", "no:cacheprovider"]
        return int(pytest.main([*options, *argv, *files], plugins=[plugin]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
