"""The run store's SQLite schema and its forward migrations.

The schema version lives in `PRAGMA user_version`; `MIGRATIONS[i]` takes a database from version i to
version i + 1, so `SCHEMA_VERSION == len(MIGRATIONS)`. Never edit a released migration: append a new one.

Conventions other packages code against (keep these names stable):
- timestamps are unix seconds as REAL (`time.time()`);
- token id arrays are packed little-endian uint32 BLOBs (`app.store.ids.pack_ids / unpack_ids`);
- JSON columns hold compact JSON text (`messages`, `tools`, `config`, `usage`, `detail`, ...);
- a sample's row id is `samples.pk`; its dataset-given id is `samples.sample_id` (unique per run).

States:
- runs.state: idle (ingested, never started) | running | paused | stopping | done | failed
- samples.state: pending | waiting | leased | done | failed | skipped (waiting, v8: a conversation's turn whose
  parent turn is not stored yet)
- jobs.state / job_shards.state: pending | submitted | running | paused | done | failed | cancelled
"""

from __future__ import annotations

RUN_STATES = ("idle", "running", "paused", "stopping", "done", "failed")
SAMPLE_STATES = ("pending", "waiting", "leased", "done", "failed", "skipped")
JOB_STATES = ("pending", "submitted", "running", "paused", "done", "failed", "cancelled")

# Version 1: the tables.
_V1 = """
CREATE TABLE runs (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    config      TEXT NOT NULL DEFAULT '{}',      -- RunConfig.redacted() as JSON: never a secret
    state       TEXT NOT NULL DEFAULT 'idle'
                CHECK (state IN ('idle','running','paused','stopping','done','failed')),
    reason      TEXT,                            -- why the run is in its state (budget, auth, operator)
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);

CREATE TABLE samples (
    pk               INTEGER PRIMARY KEY,
    run_id           INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    sample_id        TEXT NOT NULL,
    dataset          TEXT NOT NULL,
    messages         TEXT NOT NULL,              -- JSON list: the prompt, up to the final assistant turn
    tools            TEXT,                       -- JSON list or NULL
    reference_ids    BLOB,                       -- packed uint32 ground-truth output ids, or NULL
    reference_finish TEXT,                       -- the reference's meta_info.finish_reason
    state            TEXT NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending','leased','done','failed','skipped')),
    attempts         INTEGER NOT NULL DEFAULT 0, -- times leased (a crash mid-request counts)
    lease_expires    REAL,                       -- set while state = 'leased'
    error_class      TEXT,                       -- last failure's class (RetryableError, ...)
    last_error       TEXT,                       -- last failure's message
    updated_at       REAL,
    UNIQUE (run_id, sample_id)
);

CREATE TABLE responses (
    id                INTEGER PRIMARY KEY,
    run_id            INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    sample_pk         INTEGER NOT NULL REFERENCES samples(pk) ON DELETE CASCADE,
    attempt           INTEGER NOT NULL,
    endpoint          TEXT NOT NULL,
    provider          TEXT,
    model             TEXT,
    generation_id     TEXT,
    finish_reason     TEXT,
    reasoning         TEXT,
    content           TEXT,                      -- NULL for a failed attempt
    tool_calls        TEXT,                      -- JSON list of {id, name, arguments, index, type}
    logprobs          TEXT,                      -- JSON {"content": [[token, bytes|null, logprob]...], "reasoning": ...}
    token_ids         BLOB,                      -- server-returned output ids, packed uint32
    usage             TEXT,                      -- JSON of app.records.Usage
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens  INTEGER NOT NULL DEFAULT 0,
    cached_tokens     INTEGER NOT NULL DEFAULT 0,
    cost_usd          REAL NOT NULL DEFAULT 0,   -- the cost ledger is SUM(cost_usd) per run
    latency_ms        REAL,
    ttft_ms           REAL,
    error_class       TEXT,                      -- set for a failed attempt
    error             TEXT,
    raw               TEXT,                      -- the parsed body / chunks as JSON, when kept
    created_at        REAL NOT NULL
);

CREATE TABLE reconstructions (
    id            INTEGER PRIMARY KEY,
    run_id        INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    sample_pk     INTEGER NOT NULL REFERENCES samples(pk) ON DELETE CASCADE,
    response_id   INTEGER REFERENCES responses(id) ON DELETE SET NULL,
    profile       TEXT NOT NULL DEFAULT '',
    tokenizer     TEXT NOT NULL DEFAULT '',      -- tokenizer fingerprint
    strategy      TEXT NOT NULL,                 -- server_ids | logprobs | canonical | none
    repair        TEXT,
    roundtrip     INTEGER,                       -- 1/0/NULL
    notes         TEXT,                          -- JSON list of strings
    output_ids    BLOB NOT NULL,                 -- packed uint32
    reference_ids BLOB,                          -- packed uint32, NULL when unchecked
    category      TEXT NOT NULL                  -- a verdict from app.records.VERDICTS
                  CHECK (category IN ('exact','bpe_equivalent','text_mismatch','structure_mismatch',
                                      'truncated','unchecked')),
    first_diff    INTEGER,
    n_tokens      INTEGER NOT NULL,              -- len(output_ids)
    ref_len       INTEGER,
    explanation   TEXT,
    detail        TEXT,                          -- JSON: {"spans": [[ref_start, ref_end, rec_start, rec_end], ...]}
    created_at    REAL NOT NULL,
    UNIQUE (run_id, sample_pk)                   -- one current reconstruction per sample; reprocess replaces it
);

CREATE TABLE jobs (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER REFERENCES runs(id) ON DELETE SET NULL,
    name        TEXT NOT NULL,
    executor    TEXT NOT NULL,                   -- local | slurm
    spec        TEXT NOT NULL,                   -- JobSpec as JSON
    state       TEXT NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending','submitted','running','paused','done','failed','cancelled')),
    n_shards    INTEGER NOT NULL DEFAULT 0,
    output_dir  TEXT,
    external_id TEXT,                            -- e.g. a Slurm array job id
    error       TEXT,
    created_at  REAL NOT NULL,
    started_at  REAL,
    ended_at    REAL,
    updated_at  REAL NOT NULL
);

CREATE TABLE job_shards (
    job_id      INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    shard       INTEGER NOT NULL,
    state       TEXT NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending','submitted','running','paused','done','failed','cancelled')),
    pid         INTEGER,
    external_id TEXT,                            -- e.g. "<array job id>_<index>"
    done        INTEGER NOT NULL DEFAULT 0,
    total       INTEGER NOT NULL DEFAULT 0,
    tokens      INTEGER NOT NULL DEFAULT 0,
    exit_code   INTEGER,
    log_path    TEXT,
    output_path TEXT,
    error       TEXT,
    started_at  REAL,
    ended_at    REAL,
    updated_at  REAL,
    PRIMARY KEY (job_id, shard)
);

CREATE TABLE events (
    id       INTEGER PRIMARY KEY,
    run_id   INTEGER REFERENCES runs(id) ON DELETE CASCADE,
    ts       REAL NOT NULL,
    level    TEXT NOT NULL,                      -- debug | info | warning | error
    kind     TEXT NOT NULL,                      -- e.g. run, budget, endpoint, concurrency, job
    message  TEXT NOT NULL
);

CREATE TABLE commands (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    verb        TEXT NOT NULL,                   -- pause | resume | set_concurrency | cancel_job | stop ...
    args        TEXT NOT NULL DEFAULT '{}',
    created_at  REAL NOT NULL,
    done_at     REAL                             -- NULL until the engine has taken it
);
"""

# Version 2: the indexes the faces and the scheduler need.
_V2 = """
CREATE INDEX samples_by_run_state ON samples (run_id, state);
CREATE INDEX samples_leased ON samples (run_id, lease_expires) WHERE state = 'leased';
CREATE INDEX responses_by_sample ON responses (sample_pk, attempt);
CREATE INDEX responses_by_run ON responses (run_id, created_at);
-- covering index for the cost ledger and per-endpoint tallies: the rows themselves hold long texts
CREATE INDEX responses_ledger ON responses (run_id, endpoint, error_class, finish_reason, cost_usd);
CREATE INDEX reconstructions_by_run_category ON reconstructions (run_id, category, sample_pk);
CREATE INDEX reconstructions_by_sample ON reconstructions (sample_pk);
CREATE INDEX reconstructions_by_run_strategy ON reconstructions (run_id, strategy);
CREATE INDEX events_by_run ON events (run_id, id);
CREATE INDEX commands_open ON commands (run_id, id) WHERE done_at IS NULL;
CREATE INDEX jobs_by_run ON jobs (run_id, id);
"""

# Version 3: tallies the dashboard reads instead of scanning a million rows, kept in the writers'
# transactions by triggers, and an index for the mismatch list in first-difference order.
# - sample_tallies: samples per (run, state, failure class); error_class is the sample's error_class for
#   state 'failed' ('' when it has none) and '' for every other state. UPDATE and DELETE keep it by
#   trigger; INSERTs are NOT (a per-row trigger costs ingest a third of its speed): the ingest operation
#   adds its inserted count per chunk. tally_marks.samples_max_pk is the highest samples.pk the tally is
#   known to include; a reader that sees MAX(samples.pk) above it knows rows were inserted behind the
#   tally's back (direct SQL) and counts the table instead, until `app.store.tallies.recount` runs
#   (deleting the highest sample lowers the mark, so reused pks are noticed too).
# - response_tallies: responses per (run, endpoint, ok, error_class), ok = error_class IS NULL, with the
#   sums the dashboard shows; kept by INSERT / UPDATE / DELETE triggers (responses are insert-only).
# - reconstruction_tallies: reconstructions per (run, category, strategy); INSERT / UPDATE / DELETE
#   triggers (an upsert's DO UPDATE fires the UPDATE trigger).
_SAMPLE_KEY_OLD = "(CASE WHEN old.state = 'failed' THEN COALESCE(old.error_class, '') ELSE '' END)"
_SAMPLE_KEY_NEW = "(CASE WHEN new.state = 'failed' THEN COALESCE(new.error_class, '') ELSE '' END)"
_V3 = f"""
CREATE TABLE sample_tallies (
    run_id      INTEGER NOT NULL,
    state       TEXT NOT NULL,
    error_class TEXT NOT NULL DEFAULT '',
    n           INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, state, error_class)
) WITHOUT ROWID;

CREATE TABLE response_tallies (
    run_id            INTEGER NOT NULL,
    endpoint          TEXT NOT NULL,
    ok                INTEGER NOT NULL,          -- 1: error_class IS NULL (a success)
    error_class       TEXT NOT NULL DEFAULT '',  -- '' when ok
    n                 INTEGER NOT NULL DEFAULT 0,
    truncated         INTEGER NOT NULL DEFAULT 0, -- ok rows with finish_reason 'length'
    cost_usd          REAL NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, endpoint, ok, error_class)
) WITHOUT ROWID;

CREATE TABLE reconstruction_tallies (
    run_id   INTEGER NOT NULL,
    category TEXT NOT NULL,
    strategy TEXT NOT NULL,
    n        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, category, strategy)
) WITHOUT ROWID;

CREATE TABLE tally_marks (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);

CREATE TRIGGER samples_tally_update AFTER UPDATE OF state, error_class, run_id ON samples
WHEN old.state IS NOT new.state OR old.run_id IS NOT new.run_id OR {_SAMPLE_KEY_OLD} IS NOT {_SAMPLE_KEY_NEW}
BEGIN
    UPDATE sample_tallies SET n = n - 1
     WHERE run_id = old.run_id AND state = old.state AND error_class = {_SAMPLE_KEY_OLD};
    INSERT INTO sample_tallies (run_id, state, error_class, n) VALUES (new.run_id, new.state, {_SAMPLE_KEY_NEW}, 1)
        ON CONFLICT (run_id, state, error_class) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER samples_tally_delete AFTER DELETE ON samples
BEGIN
    UPDATE sample_tallies SET n = n - 1
     WHERE run_id = old.run_id AND state = old.state AND error_class = {_SAMPLE_KEY_OLD};
END;

-- deleting the highest sample lowers the mark with it (when the tally was current), so a later insert that
-- reuses the freed pks is still noticed
CREATE TRIGGER samples_mark_delete AFTER DELETE ON samples
WHEN old.pk = (SELECT value FROM tally_marks WHERE name = 'samples_max_pk')
BEGIN
    UPDATE tally_marks SET value = (SELECT COALESCE(MAX(pk), 0) FROM samples)
     WHERE name = 'samples_max_pk' AND NOT EXISTS (SELECT 1 FROM samples WHERE pk > old.pk);
END;

CREATE TRIGGER responses_tally_insert AFTER INSERT ON responses
BEGIN
    INSERT INTO response_tallies (run_id, endpoint, ok, error_class, n, truncated, cost_usd, completion_tokens)
    VALUES (new.run_id, new.endpoint, new.error_class IS NULL, COALESCE(new.error_class, ''), 1,
            new.error_class IS NULL AND new.finish_reason IS 'length', new.cost_usd, new.completion_tokens)
        ON CONFLICT (run_id, endpoint, ok, error_class) DO UPDATE SET n = n + 1, truncated = truncated + excluded.truncated,
           cost_usd = cost_usd + excluded.cost_usd, completion_tokens = completion_tokens + excluded.completion_tokens;
END;

CREATE TRIGGER responses_tally_update
AFTER UPDATE OF run_id, endpoint, error_class, finish_reason, cost_usd, completion_tokens ON responses
BEGIN
    UPDATE response_tallies SET n = n - 1, truncated = truncated - (old.error_class IS NULL AND old.finish_reason IS 'length'),
           cost_usd = cost_usd - old.cost_usd, completion_tokens = completion_tokens - old.completion_tokens
     WHERE run_id = old.run_id AND endpoint = old.endpoint AND ok = (old.error_class IS NULL)
       AND error_class = COALESCE(old.error_class, '');
    INSERT INTO response_tallies (run_id, endpoint, ok, error_class, n, truncated, cost_usd, completion_tokens)
    VALUES (new.run_id, new.endpoint, new.error_class IS NULL, COALESCE(new.error_class, ''), 1,
            new.error_class IS NULL AND new.finish_reason IS 'length', new.cost_usd, new.completion_tokens)
        ON CONFLICT (run_id, endpoint, ok, error_class) DO UPDATE SET n = n + 1, truncated = truncated + excluded.truncated,
           cost_usd = cost_usd + excluded.cost_usd, completion_tokens = completion_tokens + excluded.completion_tokens;
END;

CREATE TRIGGER responses_tally_delete AFTER DELETE ON responses
BEGIN
    UPDATE response_tallies SET n = n - 1, truncated = truncated - (old.error_class IS NULL AND old.finish_reason IS 'length'),
           cost_usd = cost_usd - old.cost_usd, completion_tokens = completion_tokens - old.completion_tokens
     WHERE run_id = old.run_id AND endpoint = old.endpoint AND ok = (old.error_class IS NULL)
       AND error_class = COALESCE(old.error_class, '');
END;

CREATE TRIGGER reconstructions_tally_insert AFTER INSERT ON reconstructions
BEGIN
    INSERT INTO reconstruction_tallies (run_id, category, strategy, n) VALUES (new.run_id, new.category, new.strategy, 1)
        ON CONFLICT (run_id, category, strategy) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER reconstructions_tally_update AFTER UPDATE OF run_id, category, strategy ON reconstructions
WHEN old.run_id IS NOT new.run_id OR old.category IS NOT new.category OR old.strategy IS NOT new.strategy
BEGIN
    UPDATE reconstruction_tallies SET n = n - 1
     WHERE run_id = old.run_id AND category = old.category AND strategy = old.strategy;
    INSERT INTO reconstruction_tallies (run_id, category, strategy, n) VALUES (new.run_id, new.category, new.strategy, 1)
        ON CONFLICT (run_id, category, strategy) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER reconstructions_tally_delete AFTER DELETE ON reconstructions
BEGIN
    UPDATE reconstruction_tallies SET n = n - 1
     WHERE run_id = old.run_id AND category = old.category AND strategy = old.strategy;
END;

CREATE TRIGGER runs_tally_delete AFTER DELETE ON runs
BEGIN
    DELETE FROM sample_tallies WHERE run_id = old.id;
    DELETE FROM response_tallies WHERE run_id = old.id;
    DELETE FROM reconstruction_tallies WHERE run_id = old.id;
END;

INSERT INTO sample_tallies (run_id, state, error_class, n)
SELECT run_id, state, CASE WHEN state = 'failed' THEN COALESCE(error_class, '') ELSE '' END, COUNT(*)
  FROM samples GROUP BY 1, 2, 3;

INSERT INTO tally_marks (name, value) SELECT 'samples_max_pk', COALESCE(MAX(pk), 0) FROM samples;

INSERT INTO response_tallies (run_id, endpoint, ok, error_class, n, truncated, cost_usd, completion_tokens)
SELECT run_id, endpoint, error_class IS NULL, COALESCE(error_class, ''), COUNT(*),
       TOTAL(error_class IS NULL AND finish_reason IS 'length'), TOTAL(cost_usd), TOTAL(completion_tokens)
  FROM responses GROUP BY 1, 2, 3, 4;

INSERT INTO reconstruction_tallies (run_id, category, strategy, n)
SELECT run_id, category, strategy, COUNT(*) FROM reconstructions GROUP BY 1, 2, 3;

-- the mismatch list in first-difference order walks this (rows without a difference come after, by sample)
CREATE INDEX reconstructions_by_run_first_diff ON reconstructions (run_id, first_diff, sample_pk, category)
    WHERE first_diff IS NOT NULL;
"""

# Version 4: tokens differing per reconstruction, stored so the mismatch list's "tokens differing" order
# walks an index instead of sorting every match. n_diff = the sum over detail's `spans`
# ([ref_start, ref_end, rec_start, rec_end]) of the longer side, 0 when detail has no spans or is not JSON;
# `N_DIFF_SQL` computes it from a detail value (the writers bind it; this migration fills existing rows).
# The index carries category so a page filtered by verdicts reads only the index.
N_DIFF_SQL = (
    "(SELECT COALESCE(SUM(MAX(json_extract(value, '$[1]') - json_extract(value, '$[0]'), "
    "json_extract(value, '$[3]') - json_extract(value, '$[2]'))), 0) "
    "FROM json_each(CASE WHEN json_valid({detail}) THEN {detail} END, '$.spans'))"
)
# Released: kept literal so a later edit of N_DIFF_SQL cannot change what this migration did.
_V4 = """
ALTER TABLE reconstructions ADD COLUMN n_diff INTEGER;
UPDATE reconstructions SET n_diff = (SELECT COALESCE(SUM(MAX(json_extract(value, '$[1]') - json_extract(value, '$[0]'), json_extract(value, '$[3]') - json_extract(value, '$[2]'))), 0) FROM json_each(CASE WHEN json_valid(detail) THEN detail END, '$.spans'));
CREATE INDEX reconstructions_by_run_n_diff ON reconstructions (run_id, n_diff DESC, sample_pk, category);
"""

# Version 5 (this round; unreleased until it lands, so its text may still grow — append, one comment header
# per concern): where each sample's ids came from, and the flags that mark a sample suspect without ground
# truth. Each concern adds its own statements below its header.
# - reconstructions.ids_source: server | logprobs | reference | text — the source of output_ids
#   ("text" = re-encoded from the returned text); NULL on rows written before v5.
# - reconstructions.flags: JSON list of suspect flags (e.g. "replacement_char", "marker_in_text",
#   "normaliser_changes", "missing_template_whitespace"); NULL or [] when none.
_V5 = """
-- provenance and suspect flags
ALTER TABLE reconstructions ADD COLUMN ids_source TEXT;
ALTER TABLE reconstructions ADD COLUMN flags TEXT;

-- the mismatch list's "longest first" order walks an index, as its other orders do; per verdict
-- (category before length), since long exact rows would otherwise sit between the mismatches
CREATE INDEX reconstructions_by_run_category_length ON reconstructions (run_id, category, n_tokens DESC, sample_pk);

-- the server's prompt ids (vLLM return_token_ids, SGLang return_prompt_token_ids) and how they compare
-- with the rendered prompt (app.tokens.prompt_check.PromptCheck: agree | differ | no_server_ids)
ALTER TABLE responses ADD COLUMN prompt_ids BLOB;
ALTER TABLE reconstructions ADD COLUMN prompt_check TEXT;
ALTER TABLE reconstructions ADD COLUMN prompt_first_diff INTEGER;

-- learned fidelity profiles (app.tokens.fidelity_profile), one per endpoint, upstream provider and profile;
-- provider '' when the endpoint reports none; body is FidelityProfile.to_json()
CREATE TABLE fidelity_profiles (
    id         INTEGER PRIMARY KEY,
    endpoint   TEXT NOT NULL,
    provider   TEXT NOT NULL DEFAULT '',
    profile    TEXT NOT NULL,
    tokenizer  TEXT NOT NULL DEFAULT '',
    probes     INTEGER NOT NULL,
    body       TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (endpoint, provider, profile)
);

-- the engine's heartbeat and live snapshot, so an attached viewer and `status` show what the engine
-- shows and say ENGINE GONE within seconds of a crash (app/store/heartbeat.py)
CREATE TABLE engine_heartbeats (
    run_id     INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    pid        INTEGER NOT NULL,
    host       TEXT NOT NULL,
    started_at REAL NOT NULL,                    -- when this engine process started the run
    beat_at    REAL NOT NULL,                    -- last beat (unix s); about once a second while it runs
    stopped_at REAL,                             -- set on a clean exit; NULL while running or after a crash
    snapshot   TEXT                              -- the engine's live figures as JSON (app.engine.record.codec)
);

-- per input file ingest progress, so an interrupted ingest is finished on restart, never taken
-- for a whole one. role: dataset | reference; name: the dataset's name ('reference' for the reference);
-- fingerprint: sha256 of the file's bytes; options: the read options (format, id_field, limit) as JSON;
-- lines_done: the last line whose chunk committed (written in that chunk's transaction);
-- complete: 1 once the last chunk committed. A run with a row at complete = 0 is half-ingested.
-- Read it with app.store.ingest_ops.ingest_status(conn, run_id).
CREATE TABLE ingest_files (
    run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    role        TEXT NOT NULL CHECK (role IN ('dataset','reference')),
    name        TEXT NOT NULL,
    path        TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    options     TEXT NOT NULL DEFAULT '{}',
    lines_done  INTEGER NOT NULL DEFAULT 0,
    complete    INTEGER NOT NULL DEFAULT 0,
    bad_lines   INTEGER NOT NULL DEFAULT 0,      -- lines refused by the last complete pass
    conflicts   INTEGER NOT NULL DEFAULT 0,      -- lines whose id the run holds with other content
    started_at  REAL,
    finished_at REAL,
    updated_at  REAL,
    PRIMARY KEY (run_id, role, name)
) WITHOUT ROWID;

-- requests sent per sample across leases and restarts (generation.attempts bounds it), and who holds
-- a lease (host:pid) so a starting engine returns only its own host's dead leases at once
ALTER TABLE samples ADD COLUMN tries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE samples ADD COLUMN lease_owner TEXT;
-- the mismatch list's free-text filter walks a trigram index instead of a LIKE scan over every row.
-- One row per reconstruction (rowid = sample_pk): the sample id, its dataset and the verdict's explanation;
-- kept by triggers in the writers' transactions (samples' ids and datasets never change once ingested).
CREATE VIRTUAL TABLE mismatch_text USING fts5(sample_id, dataset, explanation, tokenize = 'trigram');

CREATE TRIGGER reconstructions_text_insert AFTER INSERT ON reconstructions
BEGIN
    INSERT INTO mismatch_text (rowid, sample_id, dataset, explanation)
    SELECT new.sample_pk, s.sample_id, s.dataset, COALESCE(new.explanation, '') FROM samples s WHERE s.pk = new.sample_pk;
END;

CREATE TRIGGER reconstructions_text_update AFTER UPDATE OF explanation, sample_pk ON reconstructions
WHEN old.explanation IS NOT new.explanation OR old.sample_pk IS NOT new.sample_pk
BEGIN
    DELETE FROM mismatch_text WHERE rowid = old.sample_pk;
    INSERT INTO mismatch_text (rowid, sample_id, dataset, explanation)
    SELECT new.sample_pk, s.sample_id, s.dataset, COALESCE(new.explanation, '') FROM samples s WHERE s.pk = new.sample_pk;
END;

CREATE TRIGGER reconstructions_text_delete AFTER DELETE ON reconstructions
BEGIN
    DELETE FROM mismatch_text WHERE rowid = old.sample_pk;
END;

INSERT INTO mismatch_text (rowid, sample_id, dataset, explanation)
SELECT r.sample_pk, s.sample_id, s.dataset, COALESCE(r.explanation, '')
  FROM reconstructions r JOIN samples s ON s.pk = r.sample_pk;
"""

# Version 7: the run's answers by what they are, per endpoint and upstream provider, so every face
# reads the verification classes (app.records.Verification), the measured text-path fidelity, the suspects,
# the truncated answers and the prompt checks from a handful of rows, as it reads the other tallies
# (app.store.tallies.quality_tallies). One row per (run, the endpoint and provider of the reconstruction's
# response, verdict, ids source, text-path verdict, suspect, truncated, prompt check); kept by INSERT / UPDATE /
# DELETE triggers on reconstructions (a reprocess's upsert fires the UPDATE trigger). ids_source: the column
# (server | logprobs | text), or for a row from before v5 what its strategy implies. text_path: the verdict
# after `text_path:` in flags ('' when not measured); suspect: 1 when flags hold any other name (every flag
# but the informational text_path one marks a suspect: app.tokens.flags); truncated: 1 when the response
# stopped at max_tokens (finish_reason 'length'). The response is looked up when the row is counted and when
# it is uncounted: responses are never updated, so both see the same key (a tool that deletes responses
# under their reconstructions runs `app.store.tallies.recount` afterwards).
_QUALITY_KEY = (
    "run_id",
    "endpoint",
    "provider",
    "category",
    "ids_source",
    "text_path",
    "suspect",
    "truncated",
    "prompt_check",
)


def _quality_values(row: str) -> str:
    """The tally key of reconstruction `row` (new / old / r), with its responses row joined as `p`.

    `flags` is the writer's compact JSON list of flag names (no name holds a quote), so plain string functions
    read it (json_each cost the store thread a third more per result): the text-path verdict is the text after
    `"text_path:` up to its closing quote; the answer is suspect when it holds more names (quotes / 2) than
    that one text-path name.
    """
    f = f"{row}.flags"
    at = f"instr({f}, '\"text_path:')"
    return (
        f"{row}.run_id, COALESCE(p.endpoint, ''), COALESCE(p.provider, ''), {row}.category, "
        f"COALESCE({row}.ids_source, CASE {row}.strategy WHEN 'server_ids' THEN 'server' "
        f"WHEN 'logprobs' THEN 'logprobs' ELSE 'text' END), "
        f"CASE WHEN {at} > 0 THEN substr({f}, {at} + 11, instr(substr({f}, {at} + 11), '\"') - 1) ELSE '' END, "
        f"COALESCE((length({f}) - length(replace({f}, '\"', ''))) / 2 > ({at} > 0), 0), "
        f"COALESCE(p.finish_reason IS 'length', 0), COALESCE({row}.prompt_check, '')"
    )


def _quality_sql(change: str, row: str) -> str:
    """The statement that counts (`add`) or uncounts (`sub`) reconstruction `row` (new / old) in its tally row."""
    keys = ", ".join(_QUALITY_KEY)
    key_of_row = (
        f"SELECT {_quality_values(row)} FROM (SELECT {row}.response_id AS rid) AS k "
        "LEFT JOIN responses AS p ON p.id = k.rid"
    )
    if change == "add":  # (WHERE true: SQLite's parser needs it between a SELECT and ON CONFLICT)
        return (
            f"INSERT INTO quality_tallies ({keys}, n) {key_of_row.replace(' FROM (', ', 1 FROM (', 1)} "
            f"WHERE true ON CONFLICT ({keys}) DO UPDATE SET n = n + 1;"
        )
    return f"UPDATE quality_tallies SET n = n - 1 WHERE ({keys}) = ({key_of_row});"


# (re)count every reconstruction (`where`: a filter on r, or ""): the migration's backfill and tallies.recount
QUALITY_RECOUNT = (
    f"INSERT INTO quality_tallies ({', '.join(_QUALITY_KEY)}, n) SELECT {_quality_values('r')}, COUNT(*) "
    "FROM reconstructions AS r LEFT JOIN responses AS p ON p.id = r.response_id{where} GROUP BY 1, 2, 3, 4, 5, "
    "6, 7, 8, 9"
)

_QUALITY_TALLIES = f"""
-- the run's answers by what they are, per endpoint and upstream provider (app.store.tallies.quality_tallies)
CREATE TABLE quality_tallies (
    run_id       INTEGER NOT NULL,
    endpoint     TEXT NOT NULL,              -- the endpoint of the reconstruction's response ('' when none)
    provider     TEXT NOT NULL,              -- that response's upstream provider ('' when not reported)
    category     TEXT NOT NULL,              -- the verdict
    ids_source   TEXT NOT NULL,              -- server | logprobs | text (app.tokens.flags.IDS_SOURCES)
    text_path    TEXT NOT NULL,              -- the measured text-path verdict, '' when not measured
    suspect      INTEGER NOT NULL,           -- 1: flagged suspect
    truncated    INTEGER NOT NULL,           -- 1: the response stopped at max_tokens
    prompt_check TEXT NOT NULL,              -- agree | differ | no_server_ids, '' when not checked
    n            INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY ({", ".join(_QUALITY_KEY)})
) WITHOUT ROWID;

CREATE TRIGGER reconstructions_quality_insert AFTER INSERT ON reconstructions
BEGIN
    {_quality_sql("add", "new")}
END;

CREATE TRIGGER reconstructions_quality_update
AFTER UPDATE OF run_id, response_id, category, strategy, ids_source, flags, prompt_check ON reconstructions
BEGIN
    {_quality_sql("sub", "old")}
    {_quality_sql("add", "new")}
END;

CREATE TRIGGER reconstructions_quality_delete AFTER DELETE ON reconstructions
BEGIN
    {_quality_sql("sub", "old")}
END;

CREATE TRIGGER runs_quality_delete AFTER DELETE ON runs
BEGIN
    DELETE FROM quality_tallies WHERE run_id = old.id;
END;

{QUALITY_RECOUNT.format(where="")};
"""


# Version 6: the mismatch list's text index filled in bulk.
_V6 = """
-- the mismatch list's text index is filled in bulk, not row by row. A row's own FTS5 insert
-- (its trigram postings, content and docsize rows, flushed at each commit) cost the engine's store thread
-- 0.06 ms per result, 70% of writing a reconstruction; one statement over a thousand rows costs 0.008 ms a row.
-- A written or re-explained reconstruction is queued here (sample_pk, never also in mismatch_text); the writer
-- moves the queue into mismatch_text in bulk (app.store.run_store.index_pending_text: every
-- INDEX_TEXT_EVERY reconstructions, after its first batch and at close), and the free-text filter matches
-- queued rows with LIKE (app.store.queries), so it finds the same rows whether or not they are indexed yet.
CREATE TABLE mismatch_text_pending (sample_pk INTEGER PRIMARY KEY);

DROP TRIGGER reconstructions_text_insert;
CREATE TRIGGER reconstructions_text_insert AFTER INSERT ON reconstructions
BEGIN
    INSERT OR IGNORE INTO mismatch_text_pending (sample_pk) VALUES (new.sample_pk);
END;

DROP TRIGGER reconstructions_text_update;
CREATE TRIGGER reconstructions_text_update AFTER UPDATE OF explanation, sample_pk ON reconstructions
WHEN old.explanation IS NOT new.explanation OR old.sample_pk IS NOT new.sample_pk
BEGIN
    DELETE FROM mismatch_text WHERE rowid = old.sample_pk;
    DELETE FROM mismatch_text_pending WHERE sample_pk = old.sample_pk;
    INSERT OR IGNORE INTO mismatch_text_pending (sample_pk) VALUES (new.sample_pk);
END;

DROP TRIGGER reconstructions_text_delete;
CREATE TRIGGER reconstructions_text_delete AFTER DELETE ON reconstructions
BEGIN
    DELETE FROM mismatch_text WHERE rowid = old.sample_pk;
    DELETE FROM mismatch_text_pending WHERE sample_pk = old.sample_pk;
END;
"""

_V7 = (
    _QUALITY_TALLIES
    + """
-- an operator's retry of failed samples (`eaglewatch run --retry-failed`, the monitor's R) gives each a fresh
-- allowance of generation.attempts: the requests it had already cost are forgiven, while `tries` (and with it
-- each response's attempt number) keeps counting up. The engine counts tries - tries_forgiven against the limit.
ALTER TABLE samples ADD COLUMN tries_forgiven INTEGER NOT NULL DEFAULT 0;
"""
)

# Version 8: whole conversations regenerated turn by turn (app/conversation.py). Each turn is a sample row: its
# conversation, its 1-based turn of `turns`, its parent turn (turn - 1; NULL for turn 1), the messages the turn
# adds (`segment`, JSON list), the dataset's answer to it (`recorded`, JSON, NULL for a final turn after a user
# message), the dataset's tool-divergence policy (`divergence`: stop | replay) and `off_policy` (1: recorded tool
# results replayed after a call the model made differently are in its history). Turn 1 is ingested pending with
# `messages` = its segment; a later turn `waiting` with messages '[]' until its parent's result commits, which in
# the same transaction writes the child's messages (the parent's + the model's answer + the child's segment) and
# makes it pending, or skips it (and every turn after it) with the reason (app.conversation.ENDED_CLASSES).
# The CHECK on samples.state gains 'waiting': rewritten in place in the table's schema text (the rows already
# satisfy the looser constraint; SQLite's documented procedure for a change that needs no row rewritten:
# writable_schema, then RESET so every connection reloads the schema; a test runs integrity_check after it).
# turn_tallies counts the turns of conversations by (state, first turn, last turn, off-policy, error class of a
# failed or skipped turn), kept by an UPDATE trigger in the writers' transactions and by the ingest per chunk, so
# conversation counts (app.store.queries.conversation_counts) read a handful of rows at any size.
# The lease order is turns left first (longest remaining chain, then pk): samples_ready walks it.
_V8 = """
ALTER TABLE samples ADD COLUMN conversation_id TEXT;
ALTER TABLE samples ADD COLUMN turn INTEGER;
ALTER TABLE samples ADD COLUMN turns INTEGER;
ALTER TABLE samples ADD COLUMN parent_pk INTEGER;
ALTER TABLE samples ADD COLUMN segment TEXT;
ALTER TABLE samples ADD COLUMN recorded TEXT;
ALTER TABLE samples ADD COLUMN divergence TEXT;
ALTER TABLE samples ADD COLUMN off_policy INTEGER NOT NULL DEFAULT 0;

PRAGMA writable_schema = ON;
UPDATE sqlite_master
   SET sql = replace(sql, 'CHECK (state IN (''pending'',''leased'',''done'',''failed'',''skipped''))',
                          'CHECK (state IN (''pending'',''waiting'',''leased'',''done'',''failed'',''skipped''))')
 WHERE type = 'table' AND name = 'samples';
PRAGMA writable_schema = RESET;

CREATE INDEX samples_conversation ON samples (run_id, conversation_id, turn) WHERE conversation_id IS NOT NULL;
CREATE INDEX samples_ready ON samples (run_id, COALESCE(turns - turn, 0) DESC, pk) WHERE state = 'pending';
-- the conversations list pages over each conversation's first turn in ingest order
CREATE INDEX samples_first_turns ON samples (run_id, pk) WHERE turn = 1;

CREATE TABLE turn_tallies (
    run_id      INTEGER NOT NULL,
    state       TEXT NOT NULL,
    first       INTEGER NOT NULL,                -- turn = 1
    last        INTEGER NOT NULL,                -- turn = turns
    off_policy  INTEGER NOT NULL,
    error_class TEXT NOT NULL DEFAULT '',        -- a failed or skipped turn's error_class ('' otherwise)
    n           INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, state, first, last, off_policy, error_class)
) WITHOUT ROWID;

CREATE TRIGGER samples_turn_tally_update AFTER UPDATE OF state, error_class, off_policy ON samples
WHEN new.conversation_id IS NOT NULL AND (old.state IS NOT new.state OR old.off_policy IS NOT new.off_policy
     OR (CASE WHEN old.state IN ('failed','skipped') THEN COALESCE(old.error_class, '') ELSE '' END)
        IS NOT (CASE WHEN new.state IN ('failed','skipped') THEN COALESCE(new.error_class, '') ELSE '' END))
BEGIN
    UPDATE turn_tallies SET n = n - 1
     WHERE run_id = old.run_id AND state = old.state AND first = (old.turn = 1) AND last = (old.turn = old.turns)
       AND off_policy = old.off_policy
       AND error_class = (CASE WHEN old.state IN ('failed','skipped') THEN COALESCE(old.error_class, '') ELSE '' END);
    INSERT INTO turn_tallies (run_id, state, first, last, off_policy, error_class, n)
    VALUES (new.run_id, new.state, new.turn = 1, new.turn = new.turns, new.off_policy,
            CASE WHEN new.state IN ('failed','skipped') THEN COALESCE(new.error_class, '') ELSE '' END, 1)
        ON CONFLICT (run_id, state, first, last, off_policy, error_class) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER samples_turn_tally_delete AFTER DELETE ON samples
WHEN old.conversation_id IS NOT NULL
BEGIN
    UPDATE turn_tallies SET n = n - 1
     WHERE run_id = old.run_id AND state = old.state AND first = (old.turn = 1) AND last = (old.turn = old.turns)
       AND off_policy = old.off_policy
       AND error_class = (CASE WHEN old.state IN ('failed','skipped') THEN COALESCE(old.error_class, '') ELSE '' END);
END;

CREATE TRIGGER runs_turn_tally_delete AFTER DELETE ON runs
BEGIN
    DELETE FROM turn_tallies WHERE run_id = old.id;
END;
"""

# v9: each sample's category (the dataset row's category column, else NULL: the dataset's name stands for it) and
# the script its prompt is mostly written in (app.datasets.script_of; NULL for rows ingested before)
_V9 = """
ALTER TABLE samples ADD COLUMN category TEXT;
ALTER TABLE samples ADD COLUMN language TEXT;
"""

# v10, the intervention ledger: one row per thing a server did to a stored answer that the model did not (issue 31:
# OpenRouter's context compression, provider fallback and response healing as its metadata reports them; vLLM's
# thinking-budget stop, a prompt cut or counted otherwise, a repetition stop, as measured: app.engine.interventions).
# `kind` is one of app.engine.interventions.KINDS, `detail` a sentence; the sample's reconstruction carries the flag
# `intervened:<kind>` too, which is what the export reads. Older databases hold no rows: nothing was recorded then.
_V10 = """
CREATE TABLE interventions (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    sample_pk   INTEGER NOT NULL REFERENCES samples(pk) ON DELETE CASCADE,
    response_id INTEGER REFERENCES responses(id) ON DELETE CASCADE,
    kind        TEXT NOT NULL,
    detail      TEXT NOT NULL DEFAULT '',
    created_at  REAL NOT NULL
);
CREATE INDEX interventions_sample ON interventions (sample_pk);
CREATE INDEX interventions_run_kind ON interventions (run_id, kind);
"""


def _v11_eval() -> str:
    """v11 (eval): the eval run kind (`eaglewatch eval`), self-contained so renumbering it is one line.

    `runs.kind` tells a generation run from an eval run; `eval_requests` holds one row per answered eval request:
    the server's acceptance figures as it gave them (`spec` JSON, `spec_source` vllm | sglang, NULL when the
    server gave none: never a zero), their totals (accepted draft tokens, draft tokens, steps), the per-position
    accepted counts (JSON list), output ids (packed uint32), TTFT / ITL / tokens/s, whether the output is a
    repetition loop, and the sampling sent. A failed request keeps its error and no figures.
    """
    return """
ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'generate';

CREATE TABLE eval_requests (
    id              INTEGER PRIMARY KEY,
    run_id          INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    sample_pk       INTEGER NOT NULL REFERENCES samples(pk) ON DELETE CASCADE,
    endpoint        TEXT NOT NULL,
    drafter         TEXT,                          -- NULL on the baseline endpoint
    category        TEXT,
    error           TEXT,                          -- set for a failed request (no figures then)
    output_ids      BLOB,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    ttft_ms         REAL,
    itl_ms          REAL,                          -- mean inter-token latency after the first token
    latency_ms      REAL,
    tokens_per_s    REAL,
    spec_source     TEXT,                          -- vllm | sglang | NULL (the server reported no acceptance)
    spec            TEXT,                          -- the server's figures as given (JSON)
    accepted        INTEGER,
    drafted         INTEGER,
    steps           INTEGER,
    per_position    TEXT,                          -- JSON list: steps whose draft position k was accepted
    loop            INTEGER NOT NULL DEFAULT 0,    -- the output is caught in a repeated n-gram cycle
    sampling        TEXT,                          -- JSON of the sampling sent
    created_at      REAL NOT NULL,
    UNIQUE (run_id, sample_pk, endpoint)
);
CREATE INDEX eval_requests_run ON eval_requests (run_id, endpoint, id);
"""


def _v12_eval_server() -> str:
    """v12 (eval server side): what the server said beside its answers, self-contained so renumbering it is one line.

    `eval_requests.prompt_ids`: the prompt ids the server fed the model (vLLM `return_token_ids`; packed uint32;
    NULL when it returned none); `eval_requests.template` (JSON): the template guard's finding when they differ
    from the run's own rendering of the same messages (first differing position, both ids, both decoded), NULL
    when they agree or were not returned. `eval_windows`: for an endpoint whose answers carry no per-request
    figures, the deltas of its Prometheus spec-decode counters scraped before and after a window of the run
    (drafts, draft tokens, accepted tokens, accepted per position as a JSON list) — server-wide counts, kept apart
    from the per-request figures.
    """
    return """
ALTER TABLE eval_requests ADD COLUMN prompt_ids BLOB;
ALTER TABLE eval_requests ADD COLUMN template TEXT;

CREATE TABLE eval_windows (
    id              INTEGER PRIMARY KEY,
    run_id          INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    endpoint        TEXT NOT NULL,
    started_at      REAL NOT NULL,
    ended_at        REAL NOT NULL,
    requests        INTEGER NOT NULL,              -- answers received inside the window
    drafts          INTEGER NOT NULL,              -- delta of vllm:spec_decode_num_drafts_total
    draft_tokens    INTEGER NOT NULL,
    accepted        INTEGER NOT NULL,
    per_position    TEXT NOT NULL                  -- JSON list: delta of ..._accepted_tokens_per_pos_total{position}
);
CREATE INDEX eval_windows_run ON eval_windows (run_id, endpoint, id);
"""


MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _v11_eval(), _v12_eval_server())
SCHEMA_VERSION = len(MIGRATIONS)
