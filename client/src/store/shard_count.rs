//! The shard count a standalone deployment's messages are stored with, kept in
//! Redis ([`Keys::shard_count`]). A message's shard is its id's hash modulo
//! `redis.shards`, so a store with another count looks for messages where they are
//! not (a push of an id already pending goes to another shard, a duplicate) and
//! never forwards those in shards beyond its own count. The first store to connect
//! records its count; a store with any other is refused, naming the count to set.
//! Messages stored before the count was recorded are checked for the one mistake
//! that strands them: keys in shards beyond the configured count.

use super::conn::Conn;
use super::error::{Result, StoreError};
use super::keys::{DEFAULT_SHARDS, Keys, MAX_SHARDS};

/// The keys of a standalone deployment under `prefix` with `shards` shards, once
/// Redis agrees: a count other than the one recorded is refused (and, with none
/// recorded yet, pending messages in shards beyond it), else it is recorded. A user
/// not allowed the key's commands is taken at its word. `shards` 0 (a reader such
/// as the drill, not told the count) takes the recorded count, or the default while
/// none is, and records nothing: the deployment's own nodes may not have started.
pub(super) async fn keys(conn: &Conn, prefix: &str, shards: u16) -> Result<Keys> {
    if shards == 0 {
        let key = Keys::new(prefix, DEFAULT_SHARDS).shard_count();
        let count = recorded(conn, &key).await?.unwrap_or(DEFAULT_SHARDS);
        return Ok(Keys::new(prefix, count));
    }
    let keys = Keys::new(prefix, shards);
    match check_or_record(conn, &keys).await {
        Err(StoreError::Redis(e)) if e.code() == Some("NOPERM") => Ok(keys),
        other => other.map(|()| keys),
    }
}

/// The count recorded under `key`, if any.
async fn recorded(conn: &Conn, key: &str) -> Result<Option<u16>> {
    count_from(conn, key, redis::cmd("GET").arg(key)).await
}

/// The count under `key` that `cmd` answers with (a value of the key, or nil).
async fn count_from(conn: &Conn, key: &str, cmd: &redis::Cmd) -> Result<Option<u16>> {
    let text: Option<String> = cmd.query_async(&mut conn.clone()).await?;
    text.map(|text| parse(key, &text)).transpose()
}

/// A recorded count, or why it is not one.
fn parse(key: &str, text: &str) -> Result<u16> {
    text.parse()
        .ok()
        .filter(|n| (1..=MAX_SHARDS).contains(n))
        .ok_or_else(|| {
            StoreError::Unsupported(format!(
                "{key} holds {text:?}, not a shard count (1 to {MAX_SHARDS})"
            ))
        })
}

async fn check_or_record(conn: &Conn, keys: &Keys) -> Result<()> {
    let key = keys.shard_count();
    let ours = keys.shards();
    let mut count = recorded(conn, &key).await?;
    if count.is_none() {
        if let Some(highest) = highest_shard_pending(conn, keys).await? {
            return Err(StoreError::Unsupported(format!(
                "redis.shards is {ours}, but Redis holds pending messages in shard {highest} \
                 (stored with at least {} shards, before {key} recorded the count): set \
                 redis.shards to the count they were stored with",
                highest + 1
            )));
        }
        // Whoever records first sets the count; a store that lost that race reads it back.
        let mut record = redis::cmd("SET");
        record.arg(&key).arg(ours).arg("NX").arg("GET");
        count = count_from(conn, &key, &record).await?;
    }
    match count {
        Some(count) if count != ours => Err(StoreError::Unsupported(format!(
            "redis.shards is {ours}, but the messages in Redis are stored in {count} shards \
             ({key}): set redis.shards = {count} (changing it strands pending messages)"
        ))),
        _ => Ok(()),
    }
}

/// The highest shard beyond `keys.shards()` that holds a pending message (its due
/// set, bodies, compact buckets or held streams), if any.
async fn highest_shard_pending(conn: &Conn, keys: &Keys) -> Result<Option<u16>> {
    let beyond: Vec<u16> = (keys.shards()..MAX_SHARDS).collect();
    if beyond.is_empty() {
        return Ok(None);
    }
    let mut pipe = redis::pipe();
    for &shard in &beyond {
        let k = keys.shard(shard);
        pipe.cmd("EXISTS")
            .arg(&k.due)
            .arg(k.buckets())
            .arg(&k.bodies)
            .arg(&k.held);
    }
    let found: Vec<u8> = pipe.query_async(&mut conn.clone()).await?;
    Ok(beyond
        .iter()
        .zip(found)
        .filter(|&(_, n)| n > 0)
        .map(|(&shard, _)| shard)
        .next_back())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{MAX_SHARDS, parse};

    proptest! {
        #[test]
        fn every_count_in_range_reads_back(n in 1..=MAX_SHARDS) {
            prop_assert_eq!(parse("k", &n.to_string()).ok(), Some(n));
        }

        #[test]
        fn counts_out_of_range_are_refused(n in prop_oneof![Just(0u64), 1025..u64::MAX]) {
            prop_assert!(parse("k", &n.to_string()).is_err());
        }

        #[test]
        fn any_text_is_a_count_in_range_or_refused(text in "\\PC{0,12}") {
            match parse("k", &text) {
                Ok(n) => prop_assert!((1..=MAX_SHARDS).contains(&n)),
                Err(e) => prop_assert!(e.to_string().contains("not a shard count"), "{}", e),
            }
        }
    }
}
