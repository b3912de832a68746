-- tally's schema: the single source, embedded in the binary with include_str!.
-- The version lives in PRAGMA user_version (set by the store after applying this file).
-- Times are integers: milliseconds since the Unix epoch, UTC.
--
-- Three questions, three records (DESIGN §1):
--   tasks + envelopes : did the user's request leave a durable trace?
--   envelope lease, execution token : who may execute right now?
--   execution phase, provider job id, artifacts : what has already happened outside?
--
-- Image bytes live in this file too (blobs), so after a clean stop tally.db alone is the
-- whole of a shop's work.

-- The business object the user sees. Its status is the only status shown to users.
CREATE TABLE tasks (
    id               TEXT PRIMARY KEY,            -- UUIDv7: sorts by creation time
    idempotency_key  TEXT UNIQUE,                 -- client key; NULL when none was given
    request_hash     TEXT NOT NULL,               -- sha256 of the canonical request, to tell a replay from a conflict
    provider         TEXT NOT NULL,
    prompt           TEXT NOT NULL,
    params           TEXT NOT NULL DEFAULT '{}',  -- JSON object
    status           TEXT NOT NULL CHECK (status IN
                       ('queued', 'waiting', 'running', 'succeeded', 'failed', 'unknown', 'canceled')),
    reason           TEXT,                        -- why the task is in its status, in plain words
    failure_kind     TEXT CHECK (failure_kind IN
                       ('rejected', 'configuration', 'not_sent', 'rate_limited', 'undeliverable', 'expired', 'operator', 'invalid_result')),
    attempts         INTEGER NOT NULL DEFAULT 0,  -- executions that reached phase 'calling'
    may_have_charged INTEGER NOT NULL DEFAULT 0 CHECK (may_have_charged IN (0, 1)), -- unused since v5: see executions.charge
    cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    retry_of         TEXT REFERENCES tasks(id),
    set_id           TEXT REFERENCES sets(id),    -- the image set this task is a shot of
    set_position     INTEGER,                     -- order of the shot in its set
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    shot_role        TEXT CHECK (shot_role IN ('main', 'selling_point', 'scene', 'detail', 'size', 'main_white')),
    retry_key        TEXT,                        -- a retry's idempotency key: unique per original task (retry_of)
    group_key        TEXT,                        -- the submitter's optional `group` (a fairness key)
    candidate        INTEGER NOT NULL DEFAULT 0 CHECK (candidate >= 0), -- which candidate of its shot (set_position), from 0
    operation        TEXT NOT NULL DEFAULT 'generate', -- domain::operation: generate, edit, cutout (checked in code, not here)
    source_kind      TEXT CHECK (source_kind IN ('artifact', 'upload')), -- the image an edit or cutout works on
    source_id        TEXT CHECK ((source_kind IS NULL) = (source_id IS NULL)) -- its id (an artifact's or an upload's, as in blobs)
) STRICT;
CREATE INDEX tasks_by_source ON tasks(source_id) WHERE source_id IS NOT NULL;
CREATE INDEX tasks_by_status ON tasks(status, id);
CREATE INDEX tasks_by_set ON tasks(set_id, set_position) WHERE set_id IS NOT NULL;
CREATE INDEX tasks_by_retry_of ON tasks(retry_of) WHERE retry_of IS NOT NULL;
CREATE UNIQUE INDEX tasks_by_retry_key ON tasks(retry_of, retry_key) WHERE retry_key IS NOT NULL;
-- Retention (tally prune, [retention]): settled tasks by age. Partial, so live rows never
-- carry it.
CREATE INDEX tasks_settled_by_age ON tasks(updated_at) WHERE status IN ('succeeded', 'failed', 'canceled');

-- The outbox: one logical delivery of a task to the executor, written in the submit
-- transaction. 'pending' waits to be dispatched; 'sent' means "claimed by a worker of this
-- process in the dispatcher's statement": it always carries a lease (lease_token, the deadline
-- lease_expires_at, the process run lease_boot) and the task's running execution was opened in
-- the same transaction. The reconciler acts on sent envelopes past their deadline.
--
-- Dispatch order (store::ops::dispatch): a pending envelope is either *waiting* (pass NULL:
-- due_at in the future, or NULL for a later shot of a set) or *ready* (pass set). Ready rows are
-- served per provider, lane by lane in proportion to the lanes' weights, and within a lane in
-- (pass, id) order: stride scheduling over fairness keys (fair_key), so each key's next task is
-- one stride after its previous one and a new key starts at the front.
CREATE TABLE envelopes (
    id               TEXT PRIMARY KEY,
    task_id          TEXT NOT NULL UNIQUE REFERENCES tasks(id),
    provider         TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('pending', 'sent', 'consumed', 'dead')),
    due_at           INTEGER,                     -- NULL: not scheduled (a later shot of a set)
    send_count       INTEGER NOT NULL DEFAULT 0,  -- dispatches that claimed it
    sent_at          INTEGER,
    last_error       TEXT,
    lease_token      TEXT,                        -- the consume lease; set with 'sent'
    lease_expires_at INTEGER,
    lease_boot       TEXT,                        -- process run that took the lease
    budget_hold      INTEGER NOT NULL DEFAULT 0 CHECK (budget_hold IN (0, 1)), -- pending because a budget was reached
    lane             TEXT NOT NULL DEFAULT 'fresh' CHECK (lane IN ('fresh', 'recovery')),
    fair_key         TEXT NOT NULL DEFAULT '',    -- 'set:<id>', 'group:<name>', or '' (shared)
    pass             INTEGER,                     -- place in its lane while ready; NULL otherwise
    -- Held (store::held): the database turned out older than what its data directory had seen
    -- (a restored backup, a copy taken while tally ran, a deleted WAL), so this unsettled job
    -- may have been sent since by the daemon the copy came from. A held envelope is pending
    -- with due_at and pass NULL: the dispatcher never sees it until the owner releases it.
    held_at          INTEGER,
    held_reason      TEXT,
    CHECK (status <> 'sent' OR lease_expires_at IS NOT NULL),
    CHECK (lease_token IS NULL OR status = 'sent'),
    CHECK (pass IS NULL OR status = 'pending')
) STRICT;
-- Waiting envelopes by due time: the dispatcher's next wake-up and the promotion to ready.
CREATE INDEX envelopes_waiting ON envelopes(due_at) WHERE status = 'pending' AND pass IS NULL AND due_at IS NOT NULL;
-- Ready envelopes in dispatch order, and each fairness key's last place. Partial: only rows
-- that wait to be dispatched now are in them.
CREATE INDEX envelopes_ready ON envelopes(provider, lane, pass, id) WHERE status = 'pending' AND pass IS NOT NULL;
CREATE INDEX envelopes_ready_key ON envelopes(provider, lane, fair_key, pass) WHERE status = 'pending' AND pass IS NOT NULL;
-- Claimed envelopes: the provider slots in use (per lane), and the reconciler's deadlines.
CREATE INDEX envelopes_in_flight ON envelopes(provider, lane) WHERE status = 'sent';
CREATE INDEX envelopes_sent ON envelopes(lease_expires_at) WHERE status = 'sent';
-- Held envelopes (the owner's list; empty on almost every database).
CREATE INDEX envelopes_held ON envelopes(held_at) WHERE status = 'pending' AND held_at IS NOT NULL;

-- The configured providers as the dispatcher sees them: slots, the recovery lane's share,
-- and the circuit. Written at engine start (configure_providers) and by the circuit breaker;
-- read by every dispatch, so that every decision about who goes next is made in the store.
CREATE TABLE providers (
    name             TEXT PRIMARY KEY,
    max_concurrency  INTEGER NOT NULL CHECK (max_concurrency >= 1),
    reserve          INTEGER NOT NULL DEFAULT 1 CHECK (reserve >= 0), -- slots the recovery lane leaves free
    fresh_weight     INTEGER NOT NULL DEFAULT 4 CHECK (fresh_weight >= 1),
    recovery_weight  INTEGER NOT NULL DEFAULT 1 CHECK (recovery_weight >= 1),
    fifo             INTEGER NOT NULL DEFAULT 0 CHECK (fifo IN (0, 1)), -- 1: by due time only (no lanes, keys, caps)
    configured       INTEGER NOT NULL DEFAULT 1 CHECK (configured IN (0, 1)), -- 0: named by old tasks only
    paused_until     INTEGER,                     -- circuit open until then
    recovery_limit   INTEGER,                     -- slow start after the circuit closed; NULL: none
    fresh_pass       INTEGER NOT NULL DEFAULT 0,  -- the lanes' places (stride between lanes)
    recovery_pass    INTEGER NOT NULL DEFAULT 0,
    paused_reason    TEXT CHECK (paused_reason IN ('circuit', 'rate_limit')), -- why paused_until holds it
    paused_at        INTEGER,                     -- when that pause began
    paused_why       TEXT                         -- for an opened circuit: the last failure, in words
) STRICT;

-- One business run of a task. The token fences every write after the claim.
CREATE TABLE executions (
    token            TEXT PRIMARY KEY,            -- random UUIDv4: the fencing token
    task_id          TEXT NOT NULL REFERENCES tasks(id),
    attempt          INTEGER NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'unknown', 'abandoned')),
    phase            TEXT NOT NULL CHECK (phase IN ('claimed', 'calling', 'accepted')),
    idempotency_key  TEXT NOT NULL,               -- sent to the provider; stable for this execution
    provider_job_id  TEXT,                        -- persisted the moment it arrives (phase 'accepted')
    provider_handle  TEXT,                        -- the adapter's JSON for polling that job (fal's URLs), if any
    boot_id          TEXT NOT NULL,               -- process run currently driving it
    heartbeat_at     INTEGER NOT NULL,
    started_at       INTEGER NOT NULL,
    calling_at       INTEGER,
    finished_at      INTEGER,
    error            TEXT,
    -- What the evidence says about money for this request (domain::Charge). 'none' until
    -- 'calling' is recorded, and always 'none' when the provider never bills (billable = 0);
    -- 'possible' while the request is in flight; settled by the outcome.
    charge           TEXT NOT NULL DEFAULT 'none' CHECK (charge IN ('none', 'refused', 'possible', 'charged')),
    billable         INTEGER NOT NULL DEFAULT 1 CHECK (billable IN (0, 1)),
    cost_micros      INTEGER,                     -- the configured price when 'calling' was recorded (millionths)
    currency         TEXT,                        -- of cost_micros
    model            TEXT,                        -- the model the request named, for the spend report
    charge_recorded_at INTEGER,                   -- when the owner recorded `charge` by hand (resolve), else NULL
    CHECK (phase <> 'accepted' OR provider_job_id IS NOT NULL),
    CHECK (charge = 'none' OR (calling_at IS NOT NULL AND billable = 1))
) STRICT;
CREATE INDEX executions_by_task ON executions(task_id);
CREATE INDEX executions_running ON executions(task_id) WHERE status = 'running';
-- Spend and budgets: requests that reached the provider, by when they left.
CREATE INDEX executions_paid ON executions(calling_at) WHERE charge <> 'none';
-- Requests whose charge the owner recorded by hand (the spend CSV lists them, even as 'none').
CREATE INDEX executions_recorded ON executions(calling_at) WHERE charge_recorded_at IS NOT NULL;

-- A produced image. A task is 'succeeded' only with one of these; its bytes are the blob with
-- the same id, committed in the same transaction (the fenced finish, a late result, an
-- operator's resolve).
CREATE TABLE artifacts (
    id               TEXT PRIMARY KEY,            -- also the id of its bytes in blobs
    task_id          TEXT NOT NULL REFERENCES tasks(id),
    execution_token  TEXT NOT NULL UNIQUE REFERENCES executions(token),
    sha256           TEXT NOT NULL,
    bytes            INTEGER NOT NULL CHECK (bytes > 0),
    media_type       TEXT NOT NULL CHECK (media_type IN ('image/png', 'image/jpeg', 'image/webp')),
    created_at       INTEGER NOT NULL
) STRICT;
CREATE INDEX artifacts_by_task ON artifacts(task_id);

-- The append-only timeline of a task: what happened, when, who did it and why.
CREATE TABLE events (
    id               INTEGER PRIMARY KEY,
    task_id          TEXT NOT NULL REFERENCES tasks(id),
    at               INTEGER NOT NULL,
    actor            TEXT NOT NULL CHECK (actor IN ('api', 'dispatcher', 'worker', 'reconciler', 'operator')),
    kind             TEXT NOT NULL,
    message          TEXT NOT NULL,
    execution_token  TEXT
) STRICT;
CREATE INDEX events_by_task ON events(task_id, id);

-- Reference images uploaded by the user (product photos), deduplicated by content.
CREATE TABLE uploads (
    id               TEXT PRIMARY KEY,
    sha256           TEXT NOT NULL UNIQUE,        -- its bytes are the blob with the same id
    bytes            INTEGER NOT NULL CHECK (bytes > 0),
    media_type       TEXT NOT NULL CHECK (media_type IN ('image/png', 'image/jpeg', 'image/webp')),
    created_at       INTEGER NOT NULL
) STRICT;

-- A product's image set: reference photos plus a shot list. Each shot is a task
-- (tasks.set_id, tasks.set_position); only one shot of a set is scheduled at a time.
CREATE TABLE sets (
    id               TEXT PRIMARY KEY,            -- UUIDv7
    idempotency_key  TEXT UNIQUE,
    request_hash     TEXT NOT NULL,
    product          TEXT NOT NULL,
    style            TEXT,
    provider         TEXT NOT NULL,
    canceled         INTEGER NOT NULL DEFAULT 0 CHECK (canceled IN (0, 1)),
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    draft_id         TEXT,                        -- the draft (drafts.id) whose confirmed revision made it
    draft_revision   INTEGER,
    started_at       INTEGER,                     -- NULL: a copy to edit, not started (nothing of it is due)
    overlays         TEXT                         -- JSON array by shot position: the words drawn on its image, or null
) STRICT;

-- The owner's choice of one candidate image per shot (store::choice): one row per chosen shot;
-- no row means no image is chosen for that shot.
CREATE TABLE set_choices (
    set_id           TEXT NOT NULL REFERENCES sets(id),
    position         INTEGER NOT NULL,            -- the shot's set_position
    artifact_id      TEXT NOT NULL REFERENCES artifacts(id),
    chosen_at        INTEGER NOT NULL,
    PRIMARY KEY (set_id, position)
) STRICT;

-- A set's own timeline (choices made and cleared, candidates added), oldest first.
CREATE TABLE set_events (
    id               INTEGER PRIMARY KEY,
    set_id           TEXT NOT NULL REFERENCES sets(id),
    at               INTEGER NOT NULL,
    kind             TEXT NOT NULL,
    message          TEXT NOT NULL
) STRICT;
CREATE INDEX set_events_by_set ON set_events(set_id, id);

CREATE TABLE set_references (
    set_id           TEXT NOT NULL REFERENCES sets(id),
    position         INTEGER NOT NULL,
    upload_id        TEXT NOT NULL REFERENCES uploads(id),
    PRIMARY KEY (set_id, position)
) STRICT;

-- The bytes of every image: generated ones (keyed by their artifact's id) and uploaded
-- reference photos (keyed by their upload's id). A table of its own, apart from the hot task
-- tables, so that reading or updating tasks never touches image pages; `data` is the last
-- column, so reading the others never reads the image. Written only by the writer, in the
-- transaction that commits the row it belongs to; read in chunks by incremental blob I/O
-- (store::blobs), never whole per request.
CREATE TABLE blobs (
    id               TEXT PRIMARY KEY,            -- the artifact's or upload's id
    sha256           TEXT NOT NULL,               -- of data, computed before the commit
    bytes            INTEGER NOT NULL CHECK (bytes > 0),
    media_type       TEXT NOT NULL CHECK (media_type IN ('image/png', 'image/jpeg', 'image/webp')),
    data             BLOB NOT NULL CHECK (length(data) = bytes)
) STRICT;

-- Where this database stands in its history (store::lineage), one row. `lineage` is random per
-- database history (a new one when a copy turned out older and forked off); `seq` grows by one
-- in every write transaction that holds a durable operation (store::mod's writer); `running` is
-- 1 while a `tally serve` serves it (set at start, cleared at a clean stop); `backup_at` is set
-- in a copy written by `tally backup`. The data directory keeps the highest `seq` it has seen
-- per lineage in the file tally.db.seen, so an older copy put in its place is noticed.
CREATE TABLE lineage (
    id               INTEGER PRIMARY KEY CHECK (id = 1),
    lineage          TEXT NOT NULL,
    seq              INTEGER NOT NULL DEFAULT 0,
    running          INTEGER NOT NULL DEFAULT 0 CHECK (running IN (0, 1)),
    backup_at        INTEGER
) STRICT;
INSERT INTO lineage (id, lineage) VALUES (1, lower(hex(randomblob(16))));

-- A budget set from the page, the CLI or PUT /v1/budget: every limit in force, as JSON (a list
-- of {period, provider, micros, currency}). While this row exists it replaces the config's
-- [budget] and budget_daily / budget_monthly; without it the config's limits apply.
CREATE TABLE budget_setting (
    id               INTEGER PRIMARY KEY CHECK (id = 1),
    limits           TEXT NOT NULL,
    set_at           INTEGER NOT NULL
) STRICT;

-- Web page sessions (web::sessions): the sha256 of the cookie's value (never the value
-- itself), its CSRF token, when it was last used (it expires 30 days after that), and the
-- device it signed in ("iPhone · Safari", from its User-Agent; NULL for sessions older than v16).
CREATE TABLE web_sessions (
    id_hash          TEXT PRIMARY KEY,
    csrf             TEXT NOT NULL,
    created_at       INTEGER NOT NULL,
    last_used_at     INTEGER NOT NULL,
    device           TEXT
) STRICT;

-- Deliveries (issue #26; store::ops::deliveries): a set's chosen images made into a profile's
-- files and written to a target, one item per shot. An item's write is recorded (`writing`,
-- with the sha256 about to be written) before it is attempted and confirmed after; the
-- delivery's `state` is derived from its items' states (`deliveries::derive_state`) in the
-- transaction that changes them. `runner` and `lease_until` say which engine run is writing
-- it: another takes it over only once the lease ran out (or at SQLite start-up, where the
-- data-directory lock proves the earlier run dead). No foreign key to `sets`: a delivery's
-- record outlives the set's retention.
CREATE TABLE deliveries (
    id               TEXT PRIMARY KEY,
    set_id           TEXT NOT NULL,
    profile          TEXT NOT NULL,
    target           TEXT NOT NULL,
    forced           INTEGER NOT NULL DEFAULT 0 CHECK (forced IN (0, 1)),
    state            TEXT NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'delivering', 'delivered', 'partly_delivered', 'failed', 'unknown')),
    runner           TEXT,
    lease_until      INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    shopify_product  TEXT
) STRICT;
CREATE INDEX deliveries_by_set ON deliveries(set_id, id);
CREATE INDEX deliveries_open ON deliveries(id) WHERE state IN ('queued', 'delivering');

-- One file of a delivery: the chosen image of shot `position`, its file name (fixed when the
-- delivery is made, so a resumed write looks at the same name), and what became of it.
CREATE TABLE delivery_items (
    delivery_id      TEXT NOT NULL REFERENCES deliveries(id),
    position         INTEGER NOT NULL,
    task_id          TEXT NOT NULL,
    artifact_id      TEXT NOT NULL,
    shot_role        TEXT,
    file_name        TEXT NOT NULL,
    state            TEXT NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'writing', 'delivered', 'failed', 'unknown')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    sha256           TEXT,
    bytes            INTEGER,
    width            INTEGER,
    height           INTEGER,
    why              TEXT,
    retry_safe       INTEGER CHECK (retry_safe IN (0, 1)),
    updated_at       INTEGER NOT NULL,
    remote_id        TEXT,
    profile          TEXT,                        -- the profile this item is made with; NULL: the delivery's
    overlay          TEXT,                        -- JSON: the words drawn on it, as they were when it was asked for
    PRIMARY KEY (delivery_id, position)
) STRICT;

-- What start-up noticed that the owner must be told (store::notices): a lost tail of commits
-- (a deleted or lost tally.db-wal: `lost_tail`, its facts as JSON). Kept until dismissed.
CREATE TABLE notices (
    id               INTEGER PRIMARY KEY,
    kind             TEXT NOT NULL,
    at               INTEGER NOT NULL,
    data             TEXT NOT NULL,               -- JSON object
    dismissed_at     INTEGER
) STRICT;

-- Drafts (issue #36; domain::draft): a product's photos and the owner's facts, and the plans a
-- model proposed and the owner edited, as numbered revisions. Only the owner's confirmation
-- of one revision makes an image set (sets.draft_id, sets.draft_revision).
CREATE TABLE drafts (
    id               TEXT PRIMARY KEY,            -- UUIDv7
    idempotency_key  TEXT UNIQUE,
    request_hash     TEXT NOT NULL,
    product          TEXT NOT NULL,
    facts            TEXT NOT NULL,               -- the owner's facts: JSON [[key, value], ...]
    marketplace      TEXT,
    language         TEXT NOT NULL,
    provider         TEXT NOT NULL,               -- the provider that drafts
    set_id           TEXT REFERENCES sets(id),    -- the set its confirmation made
    confirmed_revision INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
) STRICT;

CREATE TABLE draft_photos (
    draft_id         TEXT NOT NULL REFERENCES drafts(id),
    position         INTEGER NOT NULL,
    upload_id        TEXT NOT NULL REFERENCES uploads(id),
    PRIMARY KEY (draft_id, position)
) STRICT;

-- A revision is either a model's (task_id: the drafting task, whose answer is in `answers`)
-- or the owner's (body: the whole draft as JSON).
CREATE TABLE draft_revisions (
    draft_id         TEXT NOT NULL REFERENCES drafts(id),
    revision         INTEGER NOT NULL CHECK (revision >= 1),
    task_id          TEXT REFERENCES tasks(id),
    body             TEXT,
    created_at       INTEGER NOT NULL,
    PRIMARY KEY (draft_id, revision),
    CHECK ((task_id IS NULL) <> (body IS NULL))
) STRICT;
CREATE INDEX draft_revisions_by_task ON draft_revisions(task_id) WHERE task_id IS NOT NULL;

-- The answer of a call whose result is JSON (a `draft` task): the model's text exactly as
-- received, the usage the provider reported, and whether it matched tally's schema (an
-- answer that did not is kept: its task failed, charged).
CREATE TABLE answers (
    task_id          TEXT PRIMARY KEY REFERENCES tasks(id),
    execution_token  TEXT NOT NULL UNIQUE REFERENCES executions(token),
    body             TEXT NOT NULL,
    usage            TEXT NOT NULL,               -- JSON {input_tokens, output_tokens}
    valid            INTEGER NOT NULL CHECK (valid IN (0, 1)),
    created_at       INTEGER NOT NULL
) STRICT;

-- Settings the owner changes in the page and that every surface reads (store::ops::settings),
-- by key: `time_zone` (an IANA name; while its row exists it replaces `[ui] time_zone`).
CREATE TABLE shop_settings (
    key              TEXT PRIMARY KEY,
    value            TEXT NOT NULL,
    set_at           INTEGER NOT NULL
) STRICT;
