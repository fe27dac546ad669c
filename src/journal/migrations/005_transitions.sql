-- 005_transitions.sql: every change of a message, a row each, in the order it was
-- made: a message's journey (GET /v1/messages/{id}/history).
-- step: 1 pushed, 2 replaced, 3 rescheduled, 4 cancelled, 5 forwarded, 6 redelivered,
-- 7 dead-lettered, 8 expired, 9 replayed, 10 restored after a loss.
-- at_ms: Redis's time of the change. node: the node that made it (a leader's step:
-- the node that held `epoch`). shard: the shard it was made in, when known. epoch:
-- the leader's term for a leader's step. token: the API token's name (or
-- fingerprint) for a step asked over HTTP. detail: the entry written (forwarded,
-- dead-lettered, expired), the new due time (rescheduled), or how it came (pushed).
-- attempt: a redelivery's attempt. reason: why it was redelivered (ack_timeout) or
-- dead-lettered (corrupt, unwritable, max_attempts).
-- A change is written once however often it is copied (the primary key), and a copy
-- that knows more (the node and token of an API change, the shard and epoch of its
-- outbox line) fills in what the other left empty. The primary key keeps a
-- message's steps together in the order they were made. by_at prunes what is past
-- journal.transitions_retention.
CREATE TABLE IF NOT EXISTS delayq_transitions (
  id VARBINARY(128) NOT NULL,
  at_ms BIGINT NOT NULL,
  step TINYINT NOT NULL,
  stream VARBINARY(256) NOT NULL,
  node VARBINARY(128) NULL,
  shard INT NULL,
  epoch BIGINT NULL,
  token VARBINARY(128) NULL,
  detail VARBINARY(256) NULL,
  attempt INT NULL,
  reason VARBINARY(64) NULL,
  PRIMARY KEY (id, at_ms, step),
  KEY by_at (at_ms)
) ENGINE = InnoDB;

-- A push's own step stays with the row it wrote until the row next changes: its
-- step (1 pushed, 2 replaced), how it came, the node and the token, at the row's
-- updated_ms. Whatever changes the row copies them into delayq_transitions first,
-- in its transaction, and empties them: a push then writes one row, not two.
ALTER TABLE delayq_messages
  ADD COLUMN IF NOT EXISTS came_step TINYINT NULL,
  ADD COLUMN IF NOT EXISTS came_how VARBINARY(16) NULL,
  ADD COLUMN IF NOT EXISTS came_node VARBINARY(128) NULL,
  ADD COLUMN IF NOT EXISTS came_token VARBINARY(128) NULL;
