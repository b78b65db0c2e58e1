-- Trace spans (the buffered tier), upserted by (trace_id, span_id), and the count of spans lost to
-- buffer overflow. Identifiers use the "C" collation so that ordering (and cursors) match SQLite's.

CREATE TABLE traces (
    trace_id       TEXT COLLATE "C" NOT NULL,
    span_id        TEXT COLLATE "C" NOT NULL,
    parent_span_id TEXT COLLATE "C",
    name           TEXT COLLATE "C" NOT NULL,
    kind           TEXT NOT NULL,
    status         TEXT NOT NULL,
    attributes     JSONB NOT NULL,
    started_at     TIMESTAMPTZ NOT NULL,
    ended_at       TIMESTAMPTZ CHECK (ended_at IS NULL OR ended_at >= started_at),
    PRIMARY KEY (trace_id, span_id)
);
-- Listings page newest first on (started_at, trace_id, span_id), optionally for one name or status.
CREATE INDEX traces_by_start ON traces (started_at, trace_id, span_id);
CREATE INDEX traces_by_name ON traces (name, started_at, trace_id, span_id);
CREATE INDEX traces_by_status ON traces (status, started_at, trace_id, span_id);

CREATE TABLE trace_counters (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL DEFAULT 0
);
