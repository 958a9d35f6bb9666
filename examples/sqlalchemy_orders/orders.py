"""Orders and their shipping jobs in one SQLAlchemy transaction: both commit, or neither does.

    python orders.py

uses DATABASE_URL (postgresql://...) if set, else a throwaway embedded PostgreSQL in
./.pgqueue/. It places three orders: one commits with its job, one is rolled back with its
job, and one is placed inside a savepoint that rolls back within a transaction that commits.
Then a worker process (`pgqueue worker orders:queue --burst`) ships what committed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from pgqueue import Queue

HERE = Path(__file__).resolve().parent


def database() -> str:
    given = os.environ.get("DATABASE_URL")
    if given:
        return given
    from pgqueue import embedded

    return embedded.start(HERE / ".pgqueue").dsn


DSN = database()
# The psycopg (3) driver: pgqueue joins the transaction of the connection under the session.
engine = create_engine("postgresql+psycopg://", creator=lambda: __import__("psycopg").connect(DSN))
queue = Queue(DSN)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "example_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100))
    shipped: Mapped[bool] = mapped_column(default=False)


@queue.task(name="orders.ship")
def ship(order_id: int) -> str:
    with Session(engine) as session, session.begin():
        order = session.get(Order, order_id)
        assert order is not None
        order.shipped = True
        return f"shipped {order.item}"


def place_orders() -> None:
    with Session(engine) as session, session.begin():
        tea = Order(item="tea")
        session.add(tea)
        session.flush()  # the order's id, for its job
        queue.enqueue(ship.job(tea.id), conn=session)

    try:
        with Session(engine) as session, session.begin():
            cake = Order(item="cake")
            session.add(cake)
            session.flush()
            queue.enqueue(ship.job(cake.id), conn=session)
            raise RuntimeError("payment declined")  # the order and its job go together
    except RuntimeError:
        pass

    with Session(engine) as session, session.begin():
        jam = Order(item="jam")
        session.add(jam)
        session.flush()
        queue.enqueue(ship.job(jam.id), conn=session)
        savepoint = session.begin_nested()
        bun = Order(item="bun")
        session.add(bun)
        session.flush()
        queue.enqueue(ship.job(bun.id), conn=session)
        savepoint.rollback()  # only the bun and its job are undone


if __name__ == "__main__":
    queue.migrate()
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    place_orders()
    worked = subprocess.run(
        [sys.executable, "-m", "pgqueue", "worker", "orders:queue", "--burst", "--dsn", DSN],
        cwd=HERE,
        env={**os.environ, "DATABASE_URL": DSN, "PYTHONPATH": str(HERE)},
    )
    with Session(engine) as session:
        for order in session.scalars(select(Order).order_by(Order.id)):
            print(f"order {order.item}: {'shipped' if order.shipped else 'not shipped'}")
    sys.exit(worked.returncode)
