"""Enqueue inside transaction.atomic() on Django's connection, no conn=: prints what each
scenario left, as JSON, for tests/integration/test_django.py."""

import json
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
django.setup()

from django.db import transaction  # noqa: E402
from shop.jobs import send_receipt  # noqa: E402
from shop.models import Order  # noqa: E402

from pgqueue.contrib.django import queue  # noqa: E402

q = queue()
seen = {}

with transaction.atomic():
    order = Order.objects.create(item="tea")
    seen["committed"] = int(send_receipt.enqueue(order.id))

try:
    with transaction.atomic():
        order = Order.objects.create(item="cake")
        seen["rolled_back"] = int(send_receipt.enqueue(order.id))
        raise RuntimeError("the view failed")
except RuntimeError:
    pass

with transaction.atomic():
    outer = Order.objects.create(item="jam")
    seen["outer"] = int(q.enqueue(send_receipt.job(outer.id)))
    try:
        with transaction.atomic():  # a savepoint
            inner = Order.objects.create(item="bun")
            seen["inner"] = int(q.enqueue(send_receipt.job(inner.id)))
            raise RuntimeError("the inner step failed")
    except RuntimeError:
        pass

order = Order.objects.create(item="pie")  # autocommit, outside any block
seen["autocommit"] = int(send_receipt.enqueue(order.id))

seen["jobs"] = sorted(j.id for j in q.list_jobs().jobs)
seen["orders"] = sorted(Order.objects.values_list("item", flat=True))
print(json.dumps(seen))
