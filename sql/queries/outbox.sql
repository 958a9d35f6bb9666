-- name: outbox_insert
-- Stages messages in the caller's transaction; ids come back in the order given. Each row
-- names its transaction (xid), taken before the first id is handed out (the CTE is
-- materialized, so it runs before the INSERT computes a single id): outbox_read relies on
-- a transaction that holds an id having its xid already. Tells the relays at commit
-- (outbox_wake), once per transaction unless this batch starts lower than what the
-- transaction already announced.
WITH input AS MATERIALIZED (
    SELECT m.destination, m.key, m.message, m.headers, m.message_id, o.n,
           pg_current_xact_id() AS xid
    FROM jsonb_array_elements(%(messages)s::jsonb) WITH ORDINALITY AS o(item, n)
    CROSS JOIN LATERAL jsonb_to_record(o.item)
         AS m(destination text, key text, message jsonb, headers jsonb, message_id text)
), inserted AS (
    INSERT INTO {schema}.outbox (destination, key, message, headers, message_id, xid)
    SELECT destination, key, message, headers, message_id, xid FROM input ORDER BY n
    RETURNING id
)
SELECT i.id
FROM inserted AS i
CROSS JOIN (SELECT {schema}.outbox_wake(min(id)) AS told FROM inserted) AS w
ORDER BY i.id;

-- name: outbox_read
-- The next committed staged messages in id order, and the transactions open in this read's
-- snapshot: `open` (its running xids) and `later` (its xmax: every xid from there on was
-- running too), on the first row only, or on a row of NULLs when there is no message.
-- Reads after the relay's hint (`after`), and at or behind it only the messages of the
-- transactions the previous read saw open (its `open` and `later`, passed back).
--
-- Invariant: a message at or behind the hint that is not yet published and may still
-- commit belongs to a transaction the previous read saw open. The relay keeps it by moving
-- its hint only up to the last id a read returned, or back. Why it holds: ids are handed
-- out in order, and a transaction has its xid before it takes its first id (outbox_insert).
-- So a message with an id below one this read sees got its id, and its transaction its
-- xid, before this read's snapshot; if this read cannot see it, that transaction was still
-- open in the snapshot (or rolled back, and the message never commits). Hence each read
-- returns what a read of every staged message from the first id would: the committed ones,
-- in id order. For one key that is the order in which the relay's reads saw transactions
-- commit; a transaction that staged the key after another had committed has higher ids;
-- within one transaction the ids are in staging order. A hint moved past a transaction
-- that was still open, and moved back only by its commit notice, let a read publish its
-- later messages before the ones behind the hint. The identity sequence must keep CACHE 1,
-- or ids stop being handed out in order across sessions.
-- The hint keeps the read off the index entries of deleted messages, which VACUUM cannot
-- remove while a long transaction runs; the open transactions' messages are looked up by
-- xid (outbox_staged_xid_idx), so that none of them is missed while the read stays there.
WITH snapshot AS MATERIALIZED (
    SELECT array(SELECT pg_snapshot_xip(s))::text[] AS open, pg_snapshot_xmax(s)::text AS later
    FROM pg_current_snapshot() AS s
), next AS (
    SELECT m.*, m.id = min(m.id) OVER () AS first
    FROM (
        (SELECT id, destination, key, message, headers, message_id, attempts
         FROM {schema}.outbox
         WHERE status = 'staged' AND id > %(after)s
         ORDER BY id
         LIMIT %(limit)s)
        UNION ALL
        (SELECT id, destination, key, message, headers, message_id, attempts
         FROM {schema}.outbox
         WHERE status = 'staged' AND id <= %(after)s
           AND (xid = ANY(%(open)s::xid8[]) OR xid >= %(later)s::xid8))
        ORDER BY id
        LIMIT %(limit)s
    ) AS m
)
SELECT CASE WHEN n.first IS NOT FALSE THEN s.open END AS open,
       CASE WHEN n.first IS NOT FALSE THEN s.later END AS later,
       n.id, n.destination, n.key, n.message, n.headers,
       coalesce(n.message_id, n.id::text) AS message_id, n.attempts
FROM snapshot AS s
LEFT JOIN next AS n ON true
ORDER BY n.id;

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
