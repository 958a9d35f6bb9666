-- 0008: the wake-up channel's two notices, built in one place.
--
-- Every statement that makes jobs claimable announces them with wake(); job_cancel asks the
-- worker running a job to stop with wake_cancel(). pgqueue/wakeup.py is the one parser of
-- both payloads. Both are plain SQL functions, so the planner inlines them where they are
-- called and they cost what the pg_notify they wrap costs.

-- 'queue priority id': the lowest (priority, id) a transaction made claimable in `queue`.
-- Queue names hold no spaces, so the payload splits unambiguously.
CREATE FUNCTION {schema}.wake(queue text, priority integer, id bigint) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify({wake_channel}, concat_ws(' ', queue, priority, id))
$$;

-- '!cancel id': a request to stop running job `id`. No queue name starts with '!'.
CREATE FUNCTION {schema}.wake_cancel(id bigint) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify({wake_channel}, '!cancel ' || id)
$$;
