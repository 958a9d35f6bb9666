-- name: relay_report
-- A relay's row, written again every few seconds: its state and counters since it started.
INSERT INTO {schema}.relays AS r
    (name, hostname, pid, is_leader, started_at, heartbeat_at, published, refused, failed,
     per_second, last_error)
VALUES (%(name)s, %(hostname)s, %(pid)s, %(leading)s, %(started_at)s, now(), %(published)s,
        %(refused)s, %(failed)s, %(per_second)s, %(last_error)s)
ON CONFLICT (name) DO UPDATE
SET is_leader = excluded.is_leader, heartbeat_at = now(), published = excluded.published,
    refused = excluded.refused, failed = excluded.failed, per_second = excluded.per_second,
    last_error = excluded.last_error;

-- name: relay_forget
-- A relay that stops takes its row with it.
DELETE FROM {schema}.relays WHERE name = %(name)s;

-- name: relay_list
-- The relays heard from within `within` seconds, the leader first.
SELECT name, is_leader, started_at, heartbeat_at, published, refused, failed, per_second,
       last_error
FROM {schema}.relays
WHERE heartbeat_at > now() - make_interval(secs => %(within)s)
ORDER BY is_leader DESC, name;
