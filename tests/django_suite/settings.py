"""The Django project Django's task tests run in: PostgreSQL through psycopg 3 on the server
of DJANGO_TEST_DSN (the test database is made beside it), pgqueue installed, and the tests'
own module `tasks` an app, as Django's runtests.py makes each test module one."""

import os

from psycopg.conninfo import conninfo_to_dict

from tests.django_suite.backends import pgqueue_tasks

_db = conninfo_to_dict(os.environ["DJANGO_TEST_DSN"])

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "pgqueue.contrib.django", "tasks"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", "postgres"),
        "USER": _db.get("user", "postgres"),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        # A name of this run's own: runs on a shared server never meet.
        "TEST": {"NAME": os.environ["DJANGO_TEST_DATABASE"]},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PGQUEUE = {"QUEUE": "tests.django_suite.jobs:queue"}
TASKS = pgqueue_tasks({"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}})
