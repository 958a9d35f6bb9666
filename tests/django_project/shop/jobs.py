"""The project's Queue: no DSN, since pgqueue.contrib.django gives it Django's connection."""

from pgqueue import Queue

queue = Queue()


@queue.task(name="shop.send_receipt")
def send_receipt(order_id: int) -> None:
    from shop.models import Order

    Order.objects.filter(id=order_id).update(receipt_sent=True)
