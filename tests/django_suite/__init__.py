"""Django's own tests of django.tasks, run against pgqueue's backend.

`python -m tests.django_suite` (make test-django) takes tests/tasks from the sdist of the
installed Django (downloaded once by pip into a cache folder, extracted for each run; never
kept in this repository) and runs test_tasks.py, test_immediate_backend.py and
test_dummy_backend.py with pytest:

- settings.py: a Django project on a test database of its own, with pgqueue installed and
  Django's tests' module `tasks` as an app, so pgqueue's workers may run its tasks.
- backends.py: where those tests name Django's DummyBackend or ImmediateBackend in TASKS,
  pgqueue's backend stands in, with the few inspection calls the tests make of them.
- plugin.py: the pytest plugin that sets all this up and maps every TASKS the tests set.
- exclusions.py: the tests that cannot apply to a database backend, each with its reason:
  the only place any test is left out.
"""
