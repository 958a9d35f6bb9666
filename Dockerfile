# The image docker-compose.yml runs its worker from: pgqueue with its command line, and the
# quickstart application of the README.
FROM python:3.12-slim
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY pgqueue ./pgqueue
COPY sql ./sql
# The checkout's own code; once released, `pip install 'pgqueue-py[cli]'` is the same. The
# slim image has no libpq, which psycopg needs: psycopg[binary] brings its own.
RUN pip install --no-cache-dir '.[cli]' 'psycopg[binary]'
COPY examples/quickstart /app
WORKDIR /app
CMD ["pgqueue", "worker", "shop:queue", "--queues", "all"]
