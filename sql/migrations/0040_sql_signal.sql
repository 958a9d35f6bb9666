-- 0040: signal() sends a durable signal from SQL, with the checks queue.signal makes.
--
-- It stores a signal for `key` with its JSON `payload` and wakes the job that has waited
-- longest for the key (ctx.wait_for_signal); a signal nobody waits for yet is kept for the
-- next job that does. In the caller's transaction: delivered only if it commits, and then
-- exactly once. A bad key or a payload over 10 MiB (Queue's default max_payload_bytes) is
-- refused with SQLSTATE 22023 and a message naming it. A SQL NULL payload is JSON null, as
-- Python's None is. Returns the signal's id. The storing and waking is signal_send's (0028),
-- which runs as its owner: a role that only enqueues may send signals.
CREATE FUNCTION {schema}.signal(key text, payload jsonb DEFAULT 'null') RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    payload_limit constant integer := 10 * 1024 * 1024;
BEGIN
    IF key IS NULL OR char_length(key) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.signal: a signal key is a string of 1-1000 characters, '
                             'got %s', coalesce(quote_literal(left(key, 40)), 'NULL'));
    END IF;
    IF payload IS NOT NULL AND octet_length(payload::text) > payload_limit THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.signal: signal %L: its payload takes %s bytes, over the '
                             '%s-byte limit', key, octet_length(payload::text), payload_limit);
    END IF;
    RETURN {schema}.signal_send(key, coalesce(payload, 'null'::jsonb));
END
$$;
