"""A django.tasks task: nothing pgqueue-specific in it."""

from django.tasks import task

from shop.models import Signup


@task(queue_name="mail", priority=10)
def send_welcome(signup_id: int) -> str:
    signup = Signup.objects.get(id=signup_id)
    signup.welcomed = True
    signup.save(update_fields=["welcomed"])
    return f"welcome mail sent to {signup.email}"
