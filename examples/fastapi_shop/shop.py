"""A FastAPI service that enqueues in the request's SQLAlchemy session.

The order and its receipt job are written in one transaction: the session dependency
commits after the handler returns, before the response is sent, and rolls both back if the
handler raises. Try it in one command, `python shop.py`: it serves on 127.0.0.1:8000 with
the worker in the app's lifespan, on a throwaway embedded PostgreSQL in ./.pgqueue/ when
SHOP_DSN is not set. In production, run it with

    SHOP_DSN=postgresql+psycopg://app@localhost/app uvicorn shop:app

and its worker as a process of its own (recommended):

    pgqueue worker shop:queue --dsn postgresql://app@localhost/app

or, with SHOP_WORKER=lifespan, inside the web process, started and stopped by the app's
lifespan.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, HTTPException
from sqlalchemy import String
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from pgqueue import AsyncQueue, Worker


def _database() -> tuple[str, Any]:
    """SHOP_DSN, else an embedded server's URL and the server (stopped with the app)."""
    given = os.environ.get("SHOP_DSN")
    if given:
        return given, None
    from pgqueue import embedded

    server = embedded.start(Path(__file__).resolve().parent / ".pgqueue")
    return server.dsn.replace("postgresql://", "postgresql+psycopg://", 1), server


DSN, EMBEDDED = _database()
SCHEMA = os.environ.get("SHOP_SCHEMA", "pgqueue")
# The tables live in the queue's schema here, to keep the example to one schema.
engine = create_async_engine(DSN, connect_args={"options": f"-c search_path={SCHEMA}"})
Sessions = async_sessionmaker(engine, expire_on_commit=False)
# Enqueues only with conn=, in the request's session; the worker is given its DSN.
queue = AsyncQueue(schema=SCHEMA)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "shop_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100))
    receipt_sent: Mapped[bool] = mapped_column(default=False)


@queue.task(name="shop.send_receipt")
async def send_receipt(order_id: int) -> None:
    async with Sessions.begin() as session:
        order = await session.get(Order, order_id)
        if order is not None:
            order.receipt_sent = True


async def request_session() -> AsyncIterator[AsyncSession]:
    """One transaction per request: committed after the handler, rolled back if it raises.
    Used with scope="function", so the commit comes before the response is sent: with
    FastAPI's default scope it would come after, and a client could act on an order whose
    rows are not there yet."""
    async with Sessions() as session, session.begin():
        yield session


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    plain_dsn = DSN.replace("postgresql+psycopg://", "postgresql://", 1)
    # For a one-command start; a deploy runs `pgqueue migrate` before the app instead.
    async with await psycopg.AsyncConnection.connect(plain_dsn, autocommit=True) as migrating:
        await queue.migrate(conn=migrating)
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    worker, running = None, None
    if os.environ.get("SHOP_WORKER") == "lifespan":
        worker = Worker(queue, dsn=plain_dsn, schema=SCHEMA, concurrency=4)
        running = asyncio.create_task(worker.run_async())
    yield
    if worker is not None and running is not None:
        worker.stop()  # running jobs finish first, within the worker's shutdown timeout
        await running
    await engine.dispose()
    if EMBEDDED is not None:  # uvicorn's exit on a signal skips the embedded server's own
        EMBEDDED.stop()


app = FastAPI(lifespan=lifespan)


@app.post("/orders")
async def place_order(
    item: str, session: Annotated[AsyncSession, Depends(request_session, scope="function")]
) -> dict[str, int]:
    order = Order(item=item)
    session.add(order)
    await session.flush()  # the order's id
    job = await queue.enqueue(send_receipt.job(order.id), conn=session)
    if item == "forbidden":
        raise HTTPException(status_code=422, detail="we do not sell that")  # both roll back
    return {"order": order.id, "job": int(job)}


@app.get("/orders/{order_id}")
async def get_order(order_id: int) -> dict[str, object]:
    async with Sessions() as session:
        order = await session.get(Order, order_id)
    if order is None:
        raise HTTPException(status_code=404, detail="no such order")
    return {"order": order.id, "item": order.item, "receipt_sent": order.receipt_sent}


if __name__ == "__main__":
    import uvicorn

    os.environ.setdefault("SHOP_WORKER", "lifespan")
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("SHOP_PORT", "8000")))
