-- Incidents: damage statekeel found in its own storage, kept until acknowledged.

-- name: incident_insert
INSERT INTO store_incidents (kind, detected_at, detail) VALUES ($1, $2, $3)
RETURNING *;

-- name: incident_list
SELECT * FROM store_incidents
WHERE ($1 OR acknowledged_at IS NULL)
ORDER BY id;

-- name: incident_acknowledge
UPDATE store_incidents SET acknowledged_at = $2, acknowledged_by = $3
WHERE id = $1 AND acknowledged_at IS NULL;
SELECT * FROM store_incidents WHERE id = $1;
