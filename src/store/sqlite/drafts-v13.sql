-- SQLite 12 → 13 (store::sqlite::open::MIGRATIONS): as in schema.sql.
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
