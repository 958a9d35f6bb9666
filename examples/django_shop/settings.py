"""A Django 6 project whose tasks run on pgqueue (django.tasks and pgqueue's own API).

The database: DATABASE_URL (postgresql://...) if set, else a throwaway embedded PostgreSQL in
./.pgqueue/, shared by every process of the example (the web side and its worker).
"""

import os
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

HERE = Path(__file__).resolve().parent


def _database_url() -> str:
    given = os.environ.get("DATABASE_URL")
    if given:
        return given
    from pgqueue import embedded

    return embedded.start(HERE / ".pgqueue").dsn


_db = conninfo_to_dict(_database_url())

SECRET_KEY = "example-only"
USE_TZ = True
INSTALLED_APPS = ["shop", "pgqueue.contrib.django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3
        "NAME": _db.get("dbname", "postgres"),
        "USER": _db.get("user", "postgres"),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The Queue pgqueue's own tasks are registered on; django.tasks jobs go through it too.
PGQUEUE = {"QUEUE": "shop.jobs:queue"}
TASKS = {
    "default": {
        "BACKEND": "pgqueue.contrib.django.Backend",
        "QUEUES": ["default", "mail"],
    }
}
