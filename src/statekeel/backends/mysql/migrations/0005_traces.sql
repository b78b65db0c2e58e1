-- Trace spans (the buffered tier), upserted by (trace_id, span_id), and the count of spans lost to
-- buffer overflow.

CREATE TABLE IF NOT EXISTS traces (
    trace_id       VARCHAR(255) NOT NULL,
    span_id        VARCHAR(255) NOT NULL,
    parent_span_id VARCHAR(255),
    name           VARCHAR(512) NOT NULL,
    kind           VARCHAR(64) NOT NULL,
    status         VARCHAR(64) NOT NULL,
    attributes     LONGTEXT NOT NULL,
    started_at     DATETIME(6) NOT NULL,
    ended_at       DATETIME(6),
    PRIMARY KEY (trace_id, span_id),
    CONSTRAINT traces_ended CHECK (ended_at IS NULL OR ended_at >= started_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- Listings page newest first on (started_at, trace_id, span_id), optionally for one name or status.
CREATE INDEX IF NOT EXISTS traces_by_start ON traces (started_at, trace_id, span_id);
CREATE INDEX IF NOT EXISTS traces_by_name ON traces (name, started_at);
CREATE INDEX IF NOT EXISTS traces_by_status ON traces (status, started_at, trace_id, span_id);

CREATE TABLE IF NOT EXISTS trace_counters (
    name  VARCHAR(255) NOT NULL PRIMARY KEY,
    value BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
