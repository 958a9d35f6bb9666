-- 0020: the outbox, where messages for other systems (a RabbitMQ exchange, a Redis stream, a
-- NATS subject, a Celery task) are staged in the application's own transaction, and from
-- which `pgqueue relay` publishes them once committed, deleting each only after the broker
-- has confirmed it. A message staged in a transaction that rolls back is never published.
--
-- destination: "sink:target", the relay's configured sink and where in it (an exchange and
-- routing key, a stream, a subject, a task name). key: messages with the same key are
-- published in the order their transactions committed; none, no order. message_id: the id
-- the broker's own dedupe field carries (the caller's, else the row's id), stable across a
-- re-publish after a crash.
-- A message the broker refuses for good stays as 'dead', with the reason, until retried.
CREATE TABLE {schema}.outbox (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    destination text        NOT NULL,
    key         text,
    message     jsonb       NOT NULL,
    headers     jsonb,
    message_id  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    status      text        NOT NULL DEFAULT 'staged',
    attempts    integer     NOT NULL DEFAULT 0,
    error       text,
    dead_at     timestamptz,
    CONSTRAINT status_known CHECK (status IN ('staged', 'dead')),
    CONSTRAINT destination_names_a_sink CHECK (destination ~ '^[A-Za-z_][A-Za-z0-9_-]*:.+$'),
    CONSTRAINT headers_are_an_object CHECK (headers IS NULL OR jsonb_typeof(headers) = 'object')
);

-- The relay reads staged messages in id order from where it last stopped (its hint), so that
-- the entries of messages it already deleted, which VACUUM may not have removed yet under a
-- long transaction, are behind it.
CREATE INDEX outbox_staged_idx ON {schema}.outbox (id) WHERE status = 'staged';

-- Tells the relays a staging transaction committed, naming its lowest message id, once per
-- transaction unless a later statement stages a lower one (a transaction-local setting keeps
-- what was sent, as wake_once does for jobs).
CREATE FUNCTION {schema}.outbox_wake(first_id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    sent text := nullif(current_setting('pgqueue.staged', true), '');
BEGIN
    IF first_id IS NULL THEN
        RETURN;
    END IF;
    IF sent IS NULL OR first_id < sent::bigint THEN
        PERFORM pg_notify({outbox_channel}, first_id::text);
        PERFORM set_config('pgqueue.staged', first_id::text, true);
    END IF;
END
$$;

-- The roles of an existing installation: whoever may enqueue may stage, and whoever runs
-- workers may relay (`pgqueue grant` grants the same on new ones).
DO $$
DECLARE
    found record;
BEGIN
    FOR found IN
        SELECT DISTINCT a.grantee,
               CASE WHEN a.privilege_type = 'DELETE' THEN 'SELECT, INSERT, UPDATE, DELETE'
                    ELSE 'SELECT, INSERT' END AS privileges
        FROM pg_class AS c CROSS JOIN aclexplode(c.relacl) AS a
        WHERE c.oid = '{schema}.jobs'::regclass
          AND a.privilege_type IN ('INSERT', 'DELETE') AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON {schema}.outbox TO %s', found.privileges,
                       CASE WHEN found.grantee = 0 THEN 'PUBLIC'
                            ELSE found.grantee::regrole::text END);
    END LOOP;
END
$$;
