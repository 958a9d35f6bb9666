"""A minimal Django project on PostgreSQL through psycopg 3, with pgqueue installed. The
database comes from DJANGO_TEST_DSN (a test's own database)."""

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["DJANGO_TEST_DSN"])

SECRET_KEY = "tests-only"
# DJANGO_DEBUG=1: Django's default logging then prints django.* records on the console too.
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "shop", "pgqueue.contrib.django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", "postgres"),
        "USER": _db.get("user", "postgres"),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PGQUEUE = {"QUEUE": "shop.jobs:queue"}
# django.tasks (Django 6): two backends, the second retrying once. No task is on "retries":
# `pgqueue_worker --queues all` serves it because TASKS lists it.
TASKS = {
    "default": {"BACKEND": "pgqueue.contrib.django.Backend", "QUEUES": ["default", "mail"]},
    "retrying": {
        "BACKEND": "pgqueue.contrib.django.Backend",
        "QUEUES": ["default", "retries"],
        "OPTIONS": {"MAX_ATTEMPTS": 2},
    },
}
if os.environ.get("DJANGO_TASKS_BROKEN_ALIAS") == "1":
    # An alias of no use whose backend does not exist, as in Django's own tests: Django
    # reports it only when it is used (and in `manage.py check`), so it must stop no other.
    TASKS["missing"] = {"BACKEND": "does.not.exist"}
