-- 002_marker.sql: the journal's marker. Its token is written to Redis too
-- (`<prefix>:journal`); a Redis without it, while the journal has messages not
-- finished, has lost its data (see the keeper).
CREATE TABLE IF NOT EXISTS delayq_marker (
  name VARCHAR(32) NOT NULL PRIMARY KEY,
  token VARCHAR(64) NOT NULL
) ENGINE = InnoDB;
