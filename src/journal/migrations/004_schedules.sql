-- 004_schedules.sql: recurring schedules' definitions (the JSON Redis keeps), so
-- that a Redis that lost its data gets them back with the messages. A deleted
-- schedule keeps its row with `definition` NULL; `updated_ms` (Redis's time of the
-- change) keeps a change written late from undoing a later one. How far each is
-- made is not kept here: its occurrences' messages (ids `<schedule>.<ms>`) are.
CREATE TABLE IF NOT EXISTS delayq_schedules (
  id VARBINARY(128) NOT NULL PRIMARY KEY,
  definition MEDIUMBLOB NULL,
  updated_ms BIGINT NOT NULL
) ENGINE = InnoDB;
