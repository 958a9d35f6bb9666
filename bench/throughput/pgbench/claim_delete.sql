-- raw bound: claim-and-delete :batch queued jobs per transaction in (priority, id) order,
-- SKIP LOCKED, on pgqueue's own table and claim index (whose predicate includes NOT atomic).
WITH picked AS (
    SELECT id FROM jobs
    WHERE queue = 'default' AND status = 'queued' AND NOT atomic
    ORDER BY priority, id
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
)
DELETE FROM jobs AS j USING picked WHERE j.id = picked.id;
