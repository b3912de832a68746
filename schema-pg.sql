-- tally's schema on PostgreSQL: the same records as schema.sql (read that file's comments for
-- what each column means), for several daemons ("nodes") sharing one database.
-- Embedded in the binary with include_str! and applied by store::pg::open; the version lives
-- in tally_schema. Times are bigint milliseconds since the Unix epoch, UTC, as on SQLite.
-- Ids are text in the "C" collation so that they sort exactly as SQLite sorts them (UUIDv7
-- ids sort by creation; list cursors compare ids).
--
-- What differs from schema.sql, and why:
--   nodes                      one row per node name: its advisory-lock key and current run
--   envelopes.lease_node       which node holds the lease (lease_boot: which run of it)
--   executions.node_id         which node drives the execution (boot_id: which run)
--   booleans are boolean, events.id is an identity column, blobs.data is bytea.
--   columns added by a migration sit at the end of their table, here as after the
--   migration (a migrated database and a new one have the same catalog: tests/it/conformance/pg_migrate.rs)
--   notify triggers            wake-ups for other nodes (hints carrying a due time, never data)

CREATE TABLE tally_schema (
    version          integer NOT NULL,
    installed_at     bigint NOT NULL
);

-- The nodes that ever ran on this database. A node holds the session advisory lock
-- (class 'taly', lock_key) on its own connection while it runs: whoever holds a node's lock
-- owns that node's leftovers.
CREATE TABLE nodes (
    name             text COLLATE "C" PRIMARY KEY,
    lock_key         integer NOT NULL UNIQUE,     -- a stable 32-bit hash of name, computed by tally
    boot_id          text,                        -- the run that holds the lock now (or last did)
    host             text,
    pid              integer,
    started_at       bigint
);

CREATE TABLE sets (
    id               text COLLATE "C" PRIMARY KEY,
    idempotency_key  text UNIQUE,
    request_hash     text NOT NULL,
    product          text NOT NULL,
    style            text,
    provider         text NOT NULL,
    canceled         boolean NOT NULL DEFAULT false,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    draft_id         text COLLATE "C",
    draft_revision   bigint,
    started_at       bigint,
    overlays         text
);

CREATE TABLE tasks (
    id               text COLLATE "C" PRIMARY KEY,
    idempotency_key  text UNIQUE,
    request_hash     text NOT NULL,
    provider         text NOT NULL,
    prompt           text NOT NULL,
    params           text NOT NULL DEFAULT '{}',
    status           text NOT NULL CHECK (status IN
                       ('queued', 'waiting', 'running', 'succeeded', 'failed', 'unknown', 'canceled')),
    reason           text,
    failure_kind     text CHECK (failure_kind IN
                       ('rejected', 'configuration', 'not_sent', 'rate_limited', 'undeliverable', 'expired', 'operator', 'invalid_result')),
    attempts         bigint NOT NULL DEFAULT 0,
    may_have_charged boolean NOT NULL DEFAULT false, -- unused since schema 2: see executions.charge
    cancel_requested boolean NOT NULL DEFAULT false,
    retry_of         text COLLATE "C" REFERENCES tasks(id),
    set_id           text COLLATE "C" REFERENCES sets(id),
    set_position     bigint,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    shot_role        text CHECK (shot_role IN ('main', 'selling_point', 'scene', 'detail', 'size', 'main_white')),
    retry_key        text,                        -- a retry's idempotency key: unique per original task (retry_of)
    group_key        text,                        -- the submitter's optional `group` (a fairness key)
    candidate        bigint NOT NULL DEFAULT 0 CHECK (candidate >= 0), -- which candidate of its shot, from 0
    operation        text NOT NULL DEFAULT 'generate', -- domain::operation (checked in code)
    source_kind      text CHECK (source_kind IN ('artifact', 'upload')), -- the image an edit or cutout works on
    source_id        text COLLATE "C",
    CONSTRAINT tasks_source_whole CHECK ((source_kind IS NULL) = (source_id IS NULL))
);
CREATE INDEX tasks_by_source ON tasks(source_id) WHERE source_id IS NOT NULL;
CREATE INDEX tasks_by_status ON tasks(status, id);
CREATE INDEX tasks_by_set ON tasks(set_id, set_position) WHERE set_id IS NOT NULL;
CREATE INDEX tasks_by_retry_of ON tasks(retry_of) WHERE retry_of IS NOT NULL;
CREATE UNIQUE INDEX tasks_by_retry_key ON tasks(retry_of, retry_key) WHERE retry_key IS NOT NULL;
CREATE INDEX tasks_settled_by_age ON tasks(updated_at) WHERE status IN ('succeeded', 'failed', 'canceled');

CREATE TABLE envelopes (
    id               text COLLATE "C" PRIMARY KEY,
    task_id          text COLLATE "C" NOT NULL UNIQUE REFERENCES tasks(id),
    provider         text NOT NULL,
    status           text NOT NULL CHECK (status IN ('pending', 'sent', 'consumed', 'dead')),
    due_at           bigint,
    send_count       bigint NOT NULL DEFAULT 0,
    sent_at          bigint,
    last_error       text,
    lease_token      text,
    lease_expires_at bigint,
    lease_node       text,                        -- node that took the lease
    lease_boot       text,                        -- run of that node
    budget_hold      boolean NOT NULL DEFAULT false, -- pending because a budget was reached
    -- The dispatch order, as on SQLite (schema.sql, store::ops::dispatch): lane, fairness key,
    -- and the place while ready (NULL while waiting).
    lane             text NOT NULL DEFAULT 'fresh' CHECK (lane IN ('fresh', 'recovery')),
    fair_key         text COLLATE "C" NOT NULL DEFAULT '',
    pass             bigint,
    -- Held, as on SQLite (schema.sql, store::held): pending with due_at and pass NULL until the
    -- owner releases it. PostgreSQL is not copied by hand, but the state and its release exist.
    held_at          bigint,
    held_reason      text,
    CHECK (status <> 'sent' OR lease_expires_at IS NOT NULL),
    CHECK (lease_token IS NULL OR status = 'sent'),
    CHECK (pass IS NULL OR status = 'pending')
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.01);
CREATE INDEX envelopes_waiting ON envelopes(due_at) WHERE status = 'pending' AND pass IS NULL AND due_at IS NOT NULL;
CREATE INDEX envelopes_ready ON envelopes(provider, lane, pass, id) WHERE status = 'pending' AND pass IS NOT NULL;
CREATE INDEX envelopes_ready_key ON envelopes(provider, lane, fair_key, pass) WHERE status = 'pending' AND pass IS NOT NULL;
CREATE INDEX envelopes_in_flight ON envelopes(provider, lane) WHERE status = 'sent';
CREATE INDEX envelopes_sent ON envelopes(lease_expires_at) WHERE status = 'sent';
CREATE INDEX envelopes_held ON envelopes(held_at) WHERE status = 'pending' AND held_at IS NOT NULL;

-- The providers as every node's dispatcher sees them (as on SQLite). The slots in use are
-- provider_slots rows (below); a dispatch locks a provider's row only to change its lane
-- places, pause or slow start, or to take from its recovery lane (`ops::dispatch`).
CREATE TABLE providers (
    name             text COLLATE "C" PRIMARY KEY,
    max_concurrency  bigint NOT NULL CHECK (max_concurrency >= 1),
    reserve          bigint NOT NULL DEFAULT 1 CHECK (reserve >= 0),
    fresh_weight     bigint NOT NULL DEFAULT 4 CHECK (fresh_weight >= 1),
    recovery_weight  bigint NOT NULL DEFAULT 1 CHECK (recovery_weight >= 1),
    fifo             boolean NOT NULL DEFAULT false,
    configured       boolean NOT NULL DEFAULT true,
    paused_until     bigint,
    recovery_limit   bigint,
    fresh_pass       bigint NOT NULL DEFAULT 0,
    recovery_pass    bigint NOT NULL DEFAULT 0,
    paused_reason    text CHECK (paused_reason IN ('circuit', 'rate_limit')),
    paused_at        bigint,
    paused_why       text
);

CREATE TABLE executions (
    token            text COLLATE "C" PRIMARY KEY,
    task_id          text COLLATE "C" NOT NULL REFERENCES tasks(id),
    attempt          bigint NOT NULL,
    status           text NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'unknown', 'abandoned')),
    phase            text NOT NULL CHECK (phase IN ('claimed', 'calling', 'accepted')),
    idempotency_key  text NOT NULL,
    provider_job_id  text,
    provider_handle  text,                        -- the adapter's JSON for polling that job, if any
    node_id          text NOT NULL,
    boot_id          text NOT NULL,
    heartbeat_at     bigint NOT NULL,
    started_at       bigint NOT NULL,
    calling_at       bigint,
    finished_at      bigint,
    error            text,
    -- What the evidence says about money for this request (domain::Charge), as on SQLite:
    -- 'none' until 'calling' is recorded, and always 'none' when the provider never bills;
    -- 'possible' while the request is in flight; settled by the outcome.
    charge           text NOT NULL DEFAULT 'none' CHECK (charge IN ('none', 'refused', 'possible', 'charged')),
    billable         boolean NOT NULL DEFAULT true,
    cost_micros      bigint,                      -- the configured price when 'calling' was recorded (millionths)
    currency         text,                        -- of cost_micros
    model            text,                        -- the model the request named, for the spend report
    charge_recorded_at bigint,                    -- when the owner recorded `charge` by hand (resolve), else NULL
    CHECK (phase <> 'accepted' OR provider_job_id IS NOT NULL),
    CONSTRAINT executions_charge_needs_a_call CHECK (charge = 'none' OR (calling_at IS NOT NULL AND billable))
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.01);
CREATE INDEX executions_by_task ON executions(task_id);
CREATE INDEX executions_running ON executions(task_id) WHERE status = 'running';
-- Spend and budgets: requests that reached the provider, by when they left.
CREATE INDEX executions_paid ON executions(calling_at) WHERE charge <> 'none';
-- Requests whose charge the owner recorded by hand (the spend CSV lists them, even as 'none').
CREATE INDEX executions_recorded ON executions(calling_at) WHERE charge_recorded_at IS NOT NULL;

CREATE TABLE artifacts (
    id               text COLLATE "C" PRIMARY KEY,
    task_id          text COLLATE "C" NOT NULL REFERENCES tasks(id),
    execution_token  text COLLATE "C" NOT NULL UNIQUE REFERENCES executions(token),
    sha256           text NOT NULL,
    bytes            bigint NOT NULL CHECK (bytes > 0),
    media_type       text NOT NULL CHECK (media_type IN ('image/png', 'image/jpeg', 'image/webp')),
    created_at       bigint NOT NULL
);
CREATE INDEX artifacts_by_task ON artifacts(task_id);

CREATE TABLE events (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id          text COLLATE "C" NOT NULL REFERENCES tasks(id),
    at               bigint NOT NULL,
    actor            text NOT NULL CHECK (actor IN ('api', 'dispatcher', 'worker', 'reconciler', 'operator')),
    kind             text NOT NULL,
    message          text NOT NULL,
    execution_token  text
);
CREATE INDEX events_by_task ON events(task_id, id);

CREATE TABLE uploads (
    id               text COLLATE "C" PRIMARY KEY,
    sha256           text NOT NULL UNIQUE,
    bytes            bigint NOT NULL CHECK (bytes > 0),
    media_type       text NOT NULL CHECK (media_type IN ('image/png', 'image/jpeg', 'image/webp')),
    created_at       bigint NOT NULL
);

-- The owner's choice of one candidate image per shot (as on SQLite, store::choice).
CREATE TABLE set_choices (
    set_id           text COLLATE "C" NOT NULL REFERENCES sets(id),
    position         bigint NOT NULL,
    artifact_id      text COLLATE "C" NOT NULL REFERENCES artifacts(id),
    chosen_at        bigint NOT NULL,
    PRIMARY KEY (set_id, position)
);

-- A set's own timeline (as on SQLite).
CREATE TABLE set_events (
    id               bigserial PRIMARY KEY,
    set_id           text COLLATE "C" NOT NULL REFERENCES sets(id),
    at               bigint NOT NULL,
    kind             text NOT NULL,
    message          text NOT NULL
);
CREATE INDEX set_events_by_set ON set_events(set_id, id);

CREATE TABLE set_references (
    set_id           text COLLATE "C" NOT NULL REFERENCES sets(id),
    position         bigint NOT NULL,
    upload_id        text COLLATE "C" NOT NULL REFERENCES uploads(id),
    PRIMARY KEY (set_id, position)
);

-- The bytes of every image (generated ones keyed by their artifact's id, uploads by their
-- upload's id), written only in the transaction that commits the row they belong to, so
-- any node serves any image. A table of its own: task rows never carry image pages.
CREATE TABLE blobs (
    id               text COLLATE "C" PRIMARY KEY,
    sha256           text NOT NULL,
    bytes            bigint NOT NULL CHECK (bytes > 0),
    media_type       text NOT NULL CHECK (media_type IN ('image/png', 'image/jpeg', 'image/webp')),
    data             bytea NOT NULL CHECK (length(data) = bytes)
);

-- A budget set from the page, the CLI or PUT /v1/budget (as on SQLite): every limit in force,
-- as JSON; while this row exists it replaces the config's limits on every node.
CREATE TABLE budget_setting (
    id               integer PRIMARY KEY CHECK (id = 1),
    limits           text NOT NULL,
    set_at           bigint NOT NULL
);

-- Web page sessions (as on SQLite): the sha256 of the cookie's value, its CSRF token, and when
-- it was last used; any node accepts a session another node started.
CREATE TABLE web_sessions (
    id_hash          text COLLATE "C" PRIMARY KEY,
    csrf             text NOT NULL,
    created_at       bigint NOT NULL,
    last_used_at     bigint NOT NULL,
    device           text
);

-- Deliveries and their items (as on SQLite; store::ops::deliveries).
CREATE TABLE deliveries (
    id               text COLLATE "C" PRIMARY KEY,
    set_id           text COLLATE "C" NOT NULL,
    profile          text NOT NULL,
    target           text NOT NULL,
    forced           boolean NOT NULL DEFAULT false,
    state            text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'delivering', 'delivered', 'partly_delivered', 'failed', 'unknown')),
    runner           text,
    lease_until      bigint,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    shopify_product  text
);
CREATE INDEX deliveries_by_set ON deliveries(set_id, id);
CREATE INDEX deliveries_open ON deliveries(id) WHERE state IN ('queued', 'delivering');

CREATE TABLE delivery_items (
    delivery_id      text COLLATE "C" NOT NULL REFERENCES deliveries(id),
    position         bigint NOT NULL,
    task_id          text COLLATE "C" NOT NULL,
    artifact_id      text COLLATE "C" NOT NULL,
    shot_role        text,
    file_name        text NOT NULL,
    state            text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'writing', 'delivered', 'failed', 'unknown')),
    attempts         bigint NOT NULL DEFAULT 0,
    sha256           text,
    bytes            bigint,
    width            bigint,
    height           bigint,
    why              text,
    retry_safe       boolean,
    updated_at       bigint NOT NULL,
    remote_id        text,
    profile          text,
    overlay          text,
    PRIMARY KEY (delivery_id, position)
);

-- Wake-ups for the other nodes. A NOTIFY is delivered at commit (dropped on rollback;
-- identical ones in one transaction are sent once) and is only ever a hint: a listener
-- re-reads the table. Channel tally_due carries the due time of an envelope that became
-- pending (or 0: a provider slot freed, look now); tally_lease the deadline of an envelope
-- that was handed out, so every node's reconciler knows the earliest deadline in the cluster.
-- Channels belong to a database, not to a schema: every channel name ends in the oid of the
-- table whose trigger sends it (`tally_due_<envelopes oid>`, `tally_task_<tasks oid>`), so
-- the nodes of one schema never hear another schema's wake-ups (`store::postgres::node`;
-- schema version 9).
CREATE FUNCTION tally_envelope_notify() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE TRIGGER envelopes_notify AFTER INSERT OR UPDATE ON envelopes
    FOR EACH ROW EXECUTE FUNCTION tally_envelope_notify();

-- tally_task_<tasks oid> carries "<task id>:<status>" whenever a task's status changes, so a node's live
-- views (the web page's event stream) see changes made by any node.
CREATE FUNCTION tally_task_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status THEN
        PERFORM pg_notify('tally_task_' || TG_RELID, NEW.id || ':' || NEW.status);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER tasks_notify AFTER INSERT OR UPDATE OF status ON tasks
    FOR EACH ROW EXECUTE FUNCTION tally_task_notify();
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

-- What start-up noticed that the owner must be told (store::notices; as on SQLite). PostgreSQL
-- is not copied as a file, so no lost tail is written here; the table keeps one store logic.
CREATE TABLE notices (
    id               bigserial PRIMARY KEY,
    kind             text NOT NULL,
    at               bigint NOT NULL,
    data             text NOT NULL,
    dismissed_at     bigint
);

-- Drafts (issue #36; domain::draft): a product's photos and the owner's facts, and the plans a
-- model proposed and the owner edited, as numbered revisions. Only the owner's confirmation
-- of one revision makes an image set (sets.draft_id, sets.draft_revision).
CREATE TABLE drafts (
    id               text COLLATE "C" PRIMARY KEY,            -- UUIDv7
    idempotency_key  text UNIQUE,
    request_hash     text NOT NULL,
    product          text NOT NULL,
    facts            text NOT NULL,               -- the owner's facts: JSON [[key, value], ...]
    marketplace      text,
    language         text NOT NULL,
    provider         text NOT NULL,               -- the provider that drafts
    set_id           text COLLATE "C" REFERENCES sets(id),    -- the set its confirmation made
    confirmed_revision bigint,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL
);

CREATE TABLE draft_photos (
    draft_id         text COLLATE "C" NOT NULL REFERENCES drafts(id),
    position         bigint NOT NULL,
    upload_id        text COLLATE "C" NOT NULL REFERENCES uploads(id),
    PRIMARY KEY (draft_id, position)
);

-- A revision is either a model's (task_id: the drafting task, whose answer is in `answers`)
-- or the owner's (body: the whole draft as JSON).
CREATE TABLE draft_revisions (
    draft_id         text COLLATE "C" NOT NULL REFERENCES drafts(id),
    revision         bigint NOT NULL CHECK (revision >= 1),
    task_id          text COLLATE "C" REFERENCES tasks(id),
    body             text,
    created_at       bigint NOT NULL,
    PRIMARY KEY (draft_id, revision),
    CHECK ((task_id IS NULL) <> (body IS NULL))
);
CREATE INDEX draft_revisions_by_task ON draft_revisions(task_id) WHERE task_id IS NOT NULL;

-- The answer of a call whose result is JSON (a `draft` task): the model's text exactly as
-- received, the usage the provider reported, and whether it matched tally's schema (an
-- answer that did not is kept: its task failed, charged).
CREATE TABLE answers (
    task_id          text COLLATE "C" PRIMARY KEY REFERENCES tasks(id),
    execution_token  text COLLATE "C" NOT NULL UNIQUE REFERENCES executions(token),
    body             text NOT NULL,
    usage            text NOT NULL,               -- JSON {input_tokens, output_tokens}
    valid            boolean NOT NULL,
    created_at       bigint NOT NULL
);

-- Settings the owner changes in the page (as on SQLite), shared by every node.
CREATE TABLE shop_settings (
    key              text PRIMARY KEY,
    value            text NOT NULL,
    set_at           bigint NOT NULL
);
