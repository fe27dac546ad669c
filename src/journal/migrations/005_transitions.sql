-- 005_transitions.sql: every change of a message, a row each, in the order it was
-- made: a message's journey (GET /v1/messages/{id}/history).
-- step: 1 pushed, 2 replaced, 3 rescheduled, 4 cancelled, 5 forwarded, 6 redelivered,
-- 7 dead-lettered, 8 expired, 9 replayed, 10 restored after a loss.
-- at_ms: Redis's time of the change. node: the node that made it (a leader's step:
-- the node that held `epoch`). shard: the shard it was made in, when known. epoch:
-- the leader's term for a leader's step. token: the API token's name (or
-- fingerprint) for a step asked over HTTP. detail: the entry written (forwarded,
-- dead-lettered, expired), the new due time (rescheduled), or how it came (pushed).
-- A change is written once however often it is copied (`once`), and a copy that knows
-- more (the node and token of an API change, the shard and epoch of its outbox
-- line) fills in what the other left empty. by_at prunes what is past
-- journal.transitions_retention.
CREATE TABLE IF NOT EXISTS delayq_transitions (
  seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  id VARBINARY(128) NOT NULL,
  stream VARBINARY(256) NOT NULL,
  step TINYINT NOT NULL,
  at_ms BIGINT NOT NULL,
  node VARBINARY(128) NULL,
  shard INT NULL,
  epoch BIGINT NULL,
  token VARBINARY(128) NULL,
  detail VARBINARY(256) NULL,
  UNIQUE KEY once (id, step, at_ms),
  KEY by_at (at_ms)
) ENGINE = InnoDB;
