-- Migration 7 → 8 of the PostgreSQL schema (`store::postgres::MIGRATIONS`): the same text as the
-- provider slot rows at the end of schema-pg.sql (`pg_migrate` checks a migrated catalog is a new one).
-- One row per provider slot (issue #28; `store::ops::slot_rows`): a `sent` envelope holds
-- exactly one, so at most `max_concurrency` envelopes of a provider are out at once across
-- every node. A dispatch takes free rows FOR UPDATE SKIP LOCKED (never waiting for another
-- node's dispatch); the triggers below free a row when its envelope leaves `sent` and size a
-- provider's rows when it is written.
CREATE TABLE provider_slots (
    provider         text COLLATE "C" NOT NULL,
    slot             bigint NOT NULL,
    envelope_id      text COLLATE "C",
    PRIMARY KEY (provider, slot)
);
CREATE UNIQUE INDEX provider_slots_by_envelope ON provider_slots(envelope_id) WHERE envelope_id IS NOT NULL;

-- An envelope that leaves `sent` (or is deleted) gives its slot back in the same transaction.
-- While a provider has more rows than `max_concurrency` (it was lowered below the calls out),
-- the row is deleted instead, under the provider's row lock so that two finishing calls do not
-- both see one row too many.
CREATE FUNCTION tally_slot_free() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cap bigint;
    total bigint;
BEGIN
    SELECT max_concurrency INTO cap FROM providers WHERE name = OLD.provider;
    SELECT count(*) INTO total FROM provider_slots WHERE provider = OLD.provider;
    IF cap IS NULL OR total > cap THEN
        PERFORM 1 FROM providers WHERE name = OLD.provider FOR UPDATE;
        SELECT max_concurrency INTO cap FROM providers WHERE name = OLD.provider;
        SELECT count(*) INTO total FROM provider_slots WHERE provider = OLD.provider;
        IF cap IS NULL OR total > cap THEN
            DELETE FROM provider_slots WHERE envelope_id = OLD.id;
            RETURN NULL;
        END IF;
    END IF;
    UPDATE provider_slots SET envelope_id = NULL WHERE envelope_id = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER provider_slots_free AFTER UPDATE OF status ON envelopes
    FOR EACH ROW WHEN (OLD.status = 'sent' AND NEW.status <> 'sent') EXECUTE FUNCTION tally_slot_free();
CREATE TRIGGER provider_slots_free_deleted AFTER DELETE ON envelopes
    FOR EACH ROW WHEN (OLD.status = 'sent') EXECUTE FUNCTION tally_slot_free();

-- A provider written (engine start) gets `max_concurrency` rows: envelopes already `sent`
-- without a row (a migrated database) get one first; then free rows are added up to the cap,
-- or free rows removed down to it (rows still held above it go as their calls end).
CREATE FUNCTION tally_slot_size() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    total bigint;
    top bigint;
BEGIN
    INSERT INTO provider_slots (provider, slot, envelope_id)
    SELECT NEW.name, coalesce((SELECT max(s.slot) FROM provider_slots s WHERE s.provider = NEW.name), -1)
                     + row_number() OVER (ORDER BY e.id), e.id
    FROM envelopes e
    WHERE e.status = 'sent' AND e.provider = NEW.name
      AND NOT EXISTS (SELECT 1 FROM provider_slots s WHERE s.envelope_id = e.id);
    SELECT count(*), coalesce(max(slot), -1) INTO total, top FROM provider_slots WHERE provider = NEW.name;
    IF total < NEW.max_concurrency THEN
        INSERT INTO provider_slots (provider, slot)
        SELECT NEW.name, top + g FROM generate_series(1, NEW.max_concurrency - total) g;
    ELSIF total > NEW.max_concurrency THEN
        DELETE FROM provider_slots WHERE provider = NEW.name AND slot IN (
            SELECT slot FROM provider_slots WHERE provider = NEW.name AND envelope_id IS NULL
            ORDER BY slot DESC LIMIT total - NEW.max_concurrency);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER provider_slots_size AFTER INSERT OR UPDATE OF max_concurrency ON providers
    FOR EACH ROW EXECUTE FUNCTION tally_slot_size();
