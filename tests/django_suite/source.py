"""Django's own tests/tasks, from the sdist of the installed Django: pip downloads the sdist
once into a cache folder; each run extracts the tests from it afresh."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

# The files of tests/tasks that exercise a backend (test_custom_backend.py tests a backend
# class of its own, not the configured one).
TEST_FILES = ("test_tasks.py", "test_immediate_backend.py", "test_dummy_backend.py")


def sdist(version: str, cache: Path) -> Path:
    """Django `version`'s sdist in `cache`, downloaded by pip unless it is there already."""
    found = _cached(version, cache)
    if found is None:
        cache.mkdir(parents=True, exist_ok=True)
        download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        download += ["--no-binary", ":all:", f"django=={version}", "--dest", str(cache)]
        subprocess.run(download, check=True)
        found = _cached(version, cache)
    if found is None:
        raise SystemExit(f"pip downloaded no sdist of Django {version} into {cache}")
    return found


def _cached(version: str, cache: Path) -> Path | None:
    names = [f"django-{version}.tar.gz", f"Django-{version}.tar.gz"]
    return next((cache / name for name in names if (cache / name).is_file()), None)


def extract_task_tests(archive: Path, into: Path) -> Path:
    """Extract tests/tasks from the sdist under `into`; returns the tests folder holding it
    (the folder Django's runtests.py puts on sys.path, so the tests import as `tasks`)."""
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        prefix = f"{top}/tests/tasks/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
        if not members:
            raise SystemExit(f"{archive} has no {prefix}")
        tar.extractall(into, members=members, filter="data")
    return into / top / "tests"
