-- PostgreSQL 11 → 12 (store::postgres::MIGRATIONS): as in schema-pg.sql.
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
