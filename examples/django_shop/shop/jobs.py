"""The project's pgqueue Queue (PGQUEUE["QUEUE"]): no DSN, since pgqueue.contrib.django gives
it Django's connection, and `manage.py pgqueue_worker` the same database."""

from pgqueue import Queue

queue = Queue()
