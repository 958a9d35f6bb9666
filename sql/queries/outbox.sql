-- name: outbox_insert
-- Stages messages in the caller's transaction; ids come back in the order given. Tells the
-- relays at commit (outbox_wake), once per transaction unless this batch starts lower than
-- what the transaction already announced.
WITH input AS (
    SELECT m.destination, m.key, m.message, m.headers, m.message_id, o.n
    FROM jsonb_array_elements(%(messages)s::jsonb) WITH ORDINALITY AS o(item, n)
    CROSS JOIN LATERAL jsonb_to_record(o.item)
         AS m(destination text, key text, message jsonb, headers jsonb, message_id text)
), inserted AS (
    INSERT INTO {schema}.outbox (destination, key, message, headers, message_id)
    SELECT destination, key, message, headers, message_id FROM input ORDER BY n
    RETURNING id
)
SELECT i.id
FROM inserted AS i
CROSS JOIN (SELECT {schema}.outbox_wake(min(id)) AS told FROM inserted) AS w
ORDER BY i.id;

-- name: outbox_read
-- The next staged messages after the relay's hint, in id order: the order their
-- transactions staged them, which for one key is the order they committed in.
SELECT id, destination, key, message, headers, coalesce(message_id, id::text) AS message_id,
       attempts
FROM {schema}.outbox
WHERE status = 'staged' AND id > %(after)s
ORDER BY id
LIMIT %(limit)s;

-- name: outbox_delete
-- Messages the broker confirmed. Guarded on status: a message an operator moved meanwhile
-- stays as it is.
DELETE FROM {schema}.outbox WHERE id = ANY(%(ids)s) AND status = 'staged';

-- name: outbox_note_failure
-- A publish that failed for a while (the broker down or refusing for now): the messages stay
-- staged, their attempts and the reason recorded for `pgqueue outbox`.
UPDATE {schema}.outbox
SET attempts = attempts + 1, error = %(error)s
WHERE id = ANY(%(ids)s) AND status = 'staged';

-- name: outbox_kill
-- Messages the broker refused for good: dead, each with its reason, until retried.
UPDATE {schema}.outbox AS o
SET status = 'dead', error = d.error, dead_at = now(), attempts = o.attempts + 1
FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS d(id, error)
WHERE o.id = d.id AND o.status = 'staged';

-- name: outbox_retry
-- Dead messages staged again (all, or those named), and the relays told: their ids are
-- behind any relay's hint.
WITH retried AS (
    UPDATE {schema}.outbox
    SET status = 'staged', error = NULL, dead_at = NULL
    WHERE status = 'dead' AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    RETURNING id
)
SELECT count(*) AS retried, {schema}.outbox_wake(min(id)) AS told FROM retried;

-- name: outbox_stats
-- Depth, oldest staged message, dead letters: what `pgqueue status` shows of the outbox.
SELECT count(*) FILTER (WHERE status = 'staged') AS staged,
       min(created_at) FILTER (WHERE status = 'staged') AS oldest_staged,
       count(*) FILTER (WHERE status = 'dead') AS dead
FROM {schema}.outbox;

-- name: outbox_list_dead
-- Dead messages, newest first, for `pgqueue outbox`.
SELECT id, destination, key, message_id, attempts, error, dead_at
FROM {schema}.outbox
WHERE status = 'dead'
ORDER BY id DESC
LIMIT %(limit)s;

-- name: outbox_lead
-- Whether this session becomes the relay that publishes: one at a time per schema, so that
-- two relays never publish the same rows, and each key has one publisher. The lock is the
-- session's: it goes with the session, so a relay that dies hands over at once.
SELECT pg_try_advisory_lock(hashtextextended(%(name)s, 0));
