//! Ids made here name their message's score (`MessageId::placed`): a push without an
//! id gets its due time fixed here, from Redis's clock as the store last read it,
//! and an id that names it, so that Redis keeps no index entry for the message while
//! it stays at that time. A due time within [`MARGIN`] of `api.limits.max_delay`
//! is left to Redis's own clock (the one read here errs ahead, by up to a round
//! trip), and so is every push when that clock cannot be read: the message keeps
//! the id it was given, with an index entry, as an id given by a producer does.

use std::time::Duration;

use crate::config::Config;
use crate::message::{Due, MessageId, NewMessage};
use crate::store::Store;

/// Delays this close to `max_delay` keep Redis's clock.
const MARGIN: Duration = Duration::from_secs(1);

/// How many shards the ids made here are spread over: on Redis Cluster a message's
/// stream names its shard.
pub(super) fn id_shards(config: &Config) -> u16 {
    if config.is_cluster() {
        1
    } else {
        config.redis.shards
    }
}

/// Gives each of `msgs` (made here, each under an id made here) an id that names
/// its score, and its due time as an epoch time.
pub(super) async fn place(store: &Store, config: &Config, msgs: Vec<&mut NewMessage>) {
    let (max_delay, shards) = (config.api.limits.max_delay, id_shards(config));
    let mut now = None;
    for msg in msgs {
        let due_ms = match msg.due {
            Due::At(ms) => ms,
            Due::In(delay) if delay + MARGIN <= max_delay => {
                if now.is_none() {
                    now = Some(store.clock_ahead_ms().await);
                }
                match &now {
                    Some(Ok(now)) => now + delay.as_millis() as u64,
                    _ => continue,
                }
            }
            Due::In(_) => continue,
        };
        if let Some(id) = MessageId::placed(due_ms, msg.priority, shards) {
            msg.id = id;
            msg.due = Due::At(due_ms);
        }
    }
}
