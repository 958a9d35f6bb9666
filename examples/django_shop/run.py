"""The whole example in one command: `python run.py`.

Sets the database up (`manage.py migrate`), signs up three users in transaction.atomic()
blocks (one rolls back, one is in a savepoint that rolls back) with a django.tasks task
enqueued for each, runs a worker process (`manage.py pgqueue_worker --queues all --burst`,
which serves the `mail` queue of shop.tasks), and prints what each TaskResult says. Only the
committed signups get their mail.
"""

import os
import subprocess
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402
from django.tasks.exceptions import TaskResultDoesNotExist  # noqa: E402
from shop.models import Signup  # noqa: E402
from shop.tasks import send_welcome  # noqa: E402


def sign_up(email: str):
    signup = Signup.objects.create(email=email)
    return send_welcome.enqueue(signup.id)


call_command("migrate", verbosity=0)
results = {}
with transaction.atomic():
    results["ada@example.com"] = sign_up("ada@example.com")
try:
    with transaction.atomic():
        results["bob@example.com"] = sign_up("bob@example.com")
        raise RuntimeError("the view failed after the enqueue")
except RuntimeError:
    pass
with transaction.atomic():
    results["cy@example.com"] = sign_up("cy@example.com")
    try:
        with transaction.atomic():  # a savepoint
            results["dee@example.com"] = sign_up("dee@example.com")
            raise RuntimeError("this step failed")
    except RuntimeError:
        pass

print("before the worker:")
for email, result in results.items():
    try:
        result.refresh()
        print(f"  {email}: {result.status}")
    except TaskResultDoesNotExist:
        print(f"  {email}: no job (rolled back with the signup)")

worker = [sys.executable, "manage.py", "pgqueue_worker", "--queues", "all", "--burst"]
worked = subprocess.run(worker, cwd=os.path.dirname(os.path.abspath(__file__)))

print("after the worker:")
for email, result in results.items():
    try:
        result.refresh()
    except TaskResultDoesNotExist:
        continue
    print(f"  {email}: {result.status}, {result.return_value!r}")
welcomed = Signup.objects.filter(welcomed=True).order_by("id")
print("welcomed:", ", ".join(welcomed.values_list("email", flat=True)))
sys.exit(worked.returncode)
