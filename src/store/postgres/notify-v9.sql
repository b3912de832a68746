-- Migration 8 → 9 of the PostgreSQL schema (`store::postgres::MIGRATIONS`): the notify
-- functions of schema-pg.sql, whose channel names now end in the sending table's oid, so that
-- nodes of another schema in the same database no longer wake this schema's nodes. The same
-- text as in schema-pg.sql (`pg_migrate` compares the functions of a migrated and a new schema).
CREATE OR REPLACE FUNCTION tally_envelope_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'pending' AND NEW.due_at IS NOT NULL
       AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM 'pending' OR OLD.due_at IS DISTINCT FROM NEW.due_at) THEN
        PERFORM pg_notify('tally_due_' || TG_RELID, NEW.due_at::text);
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.status = 'sent' AND NEW.status <> 'sent' THEN
        PERFORM pg_notify('tally_due_' || TG_RELID, '0');
    END IF;
    IF NEW.status = 'sent' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM 'sent') THEN
        PERFORM pg_notify('tally_lease_' || TG_RELID, NEW.lease_expires_at::text);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION tally_task_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status THEN
        PERFORM pg_notify('tally_task_' || TG_RELID, NEW.id || ':' || NEW.status);
    END IF;
    RETURN NULL;
END $$;
