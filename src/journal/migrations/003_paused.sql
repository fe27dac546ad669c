-- 003_paused.sql: the streams whose forwarding an operator paused, so that a
-- Redis that lost its data gets them back with the messages (the restore pauses
-- them again before forwarding resumes). A resume deletes the row; `updated_ms`
-- (Redis's time of the change) keeps a change copied late from undoing a later one.
CREATE TABLE IF NOT EXISTS delayq_paused (
  stream VARBINARY(256) NOT NULL PRIMARY KEY,
  paused TINYINT NOT NULL,
  updated_ms BIGINT NOT NULL
) ENGINE = InnoDB;
