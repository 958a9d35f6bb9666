from typing import Any, ClassVar

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: ClassVar[list[Any]] = []
    operations: ClassVar[list[Any]] = [
        migrations.CreateModel(
            name="Signup",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("email", models.EmailField(max_length=254)),
                ("welcomed", models.BooleanField(default=False)),
            ],
        )
    ]
