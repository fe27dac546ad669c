-- 001_messages.sql: the journal's messages, one row per message (its id within its
-- target stream), with the state it is in now.
-- state: 0 scheduled, 1 delivered, 2 expired, 3 dead-lettered, 4 cancelled.
-- body: what a restore needs to schedule the message again as it was pushed, as
-- JSON: {"fields": [[name, value], ...], "priority": 0-9, "ttl_ms": n | null}.
-- Indexes: the primary key finds a message by id (its prefix); by_state_due walks
-- what is not finished in due order (restore); by_state_updated finds finished
-- messages past the retention (trimming, in batches).
CREATE TABLE IF NOT EXISTS delayq_messages (
  id VARBINARY(128) NOT NULL,
  stream VARBINARY(256) NOT NULL,
  body MEDIUMBLOB NOT NULL,
  due_ms BIGINT NOT NULL,
  state TINYINT NOT NULL DEFAULT 0,
  entry_id VARBINARY(64) NULL,
  updated_ms BIGINT NOT NULL,
  PRIMARY KEY (id, stream),
  KEY by_state_due (state, due_ms),
  KEY by_state_updated (state, updated_ms)
) ENGINE = InnoDB;
