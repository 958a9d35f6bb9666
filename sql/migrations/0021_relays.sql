-- 0021: what each `pgqueue relay` process says of itself, for `pgqueue status`: whether it
-- leads or stands by, how much it has published, at what rate lately, and its last error.
-- A relay writes its row every few seconds and deletes it when it stops; a row whose
-- heartbeat is old belongs to a relay that died, and status leaves it out.
CREATE TABLE {schema}.relays (
    name         text             PRIMARY KEY,
    hostname     text             NOT NULL,
    pid          integer          NOT NULL,
    is_leader    boolean          NOT NULL,
    started_at   timestamptz      NOT NULL DEFAULT now(),
    heartbeat_at timestamptz      NOT NULL DEFAULT now(),
    published    bigint           NOT NULL DEFAULT 0,
    refused      bigint           NOT NULL DEFAULT 0,
    failed       bigint           NOT NULL DEFAULT 0,
    per_second   double precision NOT NULL DEFAULT 0,
    last_error   text
);

-- Existing roles that may relay (they may delete from the outbox) may report too.
DO $$
DECLARE
    found record;
BEGIN
    FOR found IN
        SELECT DISTINCT a.grantee
        FROM pg_class AS c CROSS JOIN aclexplode(c.relacl) AS a
        WHERE c.oid = '{schema}.outbox'::regclass
          AND a.privilege_type = 'DELETE' AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.relays TO %s',
                       CASE WHEN found.grantee = 0 THEN 'PUBLIC'
                            ELSE found.grantee::regrole::text END);
    END LOOP;
END
$$;
