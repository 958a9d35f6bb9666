-- A welcome mail for each new user, enqueued by a trigger in the inserting transaction:
-- the job commits with the user's row, or goes with its rollback, whatever inserts the row.
CREATE TABLE IF NOT EXISTS users (id bigserial PRIMARY KEY, email text NOT NULL);

CREATE OR REPLACE FUNCTION enqueue_welcome_mail() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- The queue, attempts and the rest come from the task's declaration.
    PERFORM pgqueue.enqueue('app.send_welcome',
                            jsonb_build_object('user_id', NEW.id, 'email', NEW.email));
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER users_welcome_mail AFTER INSERT ON users
    FOR EACH ROW EXECUTE FUNCTION enqueue_welcome_mail();
