"""Which django.tasks tasks pgqueue's workers can run, found ahead of any job naming them:
the tasks of pgqueue's backends in each installed app's `tasks` module and in the modules
OPTIONS["MODULES"] names (and their `tasks`), with their queues, and the queues the TASKS
entries list. A worker given `--queues all` serves them all and warns of any task whose
queue it does not serve (Registry.discover).

A module that is not there is skipped; one that is there but fails to import raises, as
Django's own discovery of apps' modules does: its tasks would fail in the worker anyway.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from django.apps import apps
from django.tasks import DEFAULT_TASK_QUEUE_NAME
from django.tasks import Task as DjangoTask

from pgqueue.models import QUEUE_NAME
from pgqueue.registry import Discovered


def discover(
    aliases: Mapping[str, Mapping[str, Any]], allowed: Callable[[str], bool]
) -> Discovered:
    """The tasks of the pgqueue backends `aliases` (TASKS entries by alias) in modules
    workers may import (`allowed`), and every queue they or the entries name."""
    tasks: dict[str, str] = {}
    queues = {name for params in aliases.values() for name in _listed_queues(params)}
    for module in _task_modules(aliases):
        for value in vars(module).values():
            if (
                isinstance(value, DjangoTask)
                and value.backend in aliases
                and allowed(value.module_path)
            ):
                tasks.setdefault(value.module_path, value.queue_name)
                queues.add(value.queue_name)  # a .using(queue_name=...) copy's too
    return Discovered(
        tasks={name: queue for name, queue in tasks.items() if _is_queue(queue)},
        queues=frozenset(filter(_is_queue, queues)),
    )


def _listed_queues(params: Mapping[str, Any]) -> list[str]:
    """An entry's QUEUES (Django's default when absent; none for [], which allows any)."""
    listed = params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])
    if not isinstance(listed, (list, tuple, set, frozenset)):
        return []
    return [name for name in listed if isinstance(name, str)]


def _is_queue(name: str) -> bool:
    # A name pgqueue refuses is refused at enqueue too: no job can wait on it.
    return QUEUE_NAME.fullmatch(name) is not None


def _task_modules(aliases: Mapping[str, Mapping[str, Any]]) -> Iterator[ModuleType]:
    names = [f"{config.name}.tasks" for config in apps.get_app_configs()]
    for params in aliases.values():
        modules = (params.get("OPTIONS") or {}).get("MODULES", [])
        if isinstance(modules, (list, tuple)):
            names += [
                name
                for module in modules
                if isinstance(module, str)
                for name in (module, f"{module}.tasks")
            ]
    for name in names:
        module = _import_if_there(name)
        if module is not None:
            yield module


def _import_if_there(name: str) -> ModuleType | None:
    """The module `name`, or None when there is no such module."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            return None
        raise  # the module is there, and something it imports is not
