"""The project's Queue: it has no tasks of its own, only the django.tasks ones."""

from pgqueue import Queue

queue = Queue()
