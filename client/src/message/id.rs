//! Ids: a message's id (client-supplied or generated, and the shard it lives in) and
//! a stream entry's id as a client gives it.

use std::fmt;

use super::InvalidMessage;

/// Longest id a client may supply.
pub const MAX_ID_LEN: usize = 128;

/// The rule for words a producer names a message by (ids, business keys):
/// `[A-Za-z0-9._:-]{1,max}`; the error names `what`.
pub(super) fn check_word(what: &str, word: &str, max: usize) -> Result<(), String> {
    if word.is_empty() || word.len() > max {
        return Err(format!(
            "{what} {word:?}: must be 1 to {max} characters long"
        ));
    }
    if let Some(bad) = word
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(format!(
            "{what} {word:?}: character {bad:?} is not allowed (allowed: A-Z a-z 0-9 . _ : -)"
        ));
    }
    Ok(())
}

/// A message id: client-supplied (`[A-Za-z0-9._:-]{1,128}`) or generated (a ULID,
/// which sorts by creation time, and within one process in the order generated; or,
/// for a push, an id that names the message's due time, see [`MessageId::placed`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(String);

impl MessageId {
    /// Checks a client-supplied id.
    pub fn parse(id: &str) -> Result<Self, InvalidMessage> {
        check_word("id", id, MAX_ID_LEN).map_err(InvalidMessage::Id)?;
        Ok(MessageId(id.to_owned()))
    }

    /// A fresh, time-sortable id, after every id this process generated before it
    /// (ULIDs made in one millisecond count up from a random start; a clock that
    /// steps back does too). Messages due at one time sort by id (`score, id`), so
    /// messages pushed without an id, due in the same millisecond, are delivered in
    /// the order their ids were made, and Redis stores each one after the last
    /// instead of searching its bucket. Should the count run out within one
    /// millisecond (2^80 - start ids), the next id is random, out of that order.
    pub fn generate() -> Self {
        MessageId(super::made::make(1).to_string())
    }

    /// A fresh id as [`MessageId::generate`]'s that, made in the same millisecond
    /// as ids before it, lives in the same one of `shards` shards as they do (nearly
    /// always, up to 64 shards): pushes that arrive together then share their
    /// shard's part of one call into Redis. The first id of a millisecond picks its
    /// shard at random, so shards still get even shares over time.
    pub fn generate_in(shards: u16) -> Self {
        MessageId(super::made::make(shards).to_string())
    }

    /// A fresh id that names the due-set score of a message due at `due_ms` with
    /// `priority` (see `placed.rs`), in the shard of the ids made before it in its
    /// millisecond as [`MessageId::generate_in`]'s; None for a due time too far to
    /// name. Redis keeps no index entry for a message under such an id while the
    /// message keeps that score.
    pub fn placed(due_ms: u64, priority: u8, shards: u16) -> Option<Self> {
        // Past u64 / 10 the score overflows; far below that it is too high to name.
        let due_ms = (due_ms <= u64::MAX / 10).then_some(due_ms)?;
        let score = super::due_score(due_ms, priority.min(super::MAX_PRIORITY));
        super::placed::make(score, shards).map(MessageId)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shard this id lives in. CRC-32 (IEEE) is fixed by a standard, so every
    /// version of the daemon and of the client agrees on it.
    pub fn shard(&self, shards: u16) -> u16 {
        super::shard_of_text(self.0.as_bytes(), shards)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stream entry id as a client gives it: `<ms>-<seq>` or `<ms>`, each part a
/// decimal number (at most 20 digits) that fits in 64 bits, as Redis requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryId {
    pub ms: u64,
    pub seq: Option<u64>,
}

impl EntryId {
    pub fn parse(text: &str) -> Option<EntryId> {
        let number = |s: &str| {
            (!s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u64>().ok())
                .flatten()
        };
        let (ms, seq) = match text.split_once('-') {
            Some((ms, seq)) => (ms, Some(number(seq)?)),
            None => (text, None),
        };
        Some(EntryId {
            ms: number(ms)?,
            seq,
        })
    }

    /// Whether no entry can come after this one (`XRANGE` refuses an exclusive
    /// start here).
    pub fn is_last(&self) -> bool {
        self.ms == u64::MAX && self.seq == Some(u64::MAX)
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.seq {
            Some(seq) => write!(f, "{}-{seq}", self.ms),
            None => write!(f, "{}", self.ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use delayq_harness::props::{beyond_u64, expect};

    proptest! {
        #[test]
        fn message_ids_round_trip(id in "[A-Za-z0-9._:-]{1,128}") {
            expect(&id, MessageId::parse(&id).map(|m| m.as_str().to_owned()), Some(id.clone()))?;
        }

        #[test]
        fn long_message_ids_or_other_characters_are_refused(
            id in "[A-Za-z0-9._:-]{129,300}|[a-z0-9]{0,5}[^A-Za-z0-9._:-][a-z0-9]{0,5}",
        ) {
            expect(&id, MessageId::parse(&id), None)?;
        }

        #[test]
        fn entry_ids_round_trip(ms: u64, seq: Option<u64>) {
            let id = EntryId { ms, seq };
            expect(&id.to_string(), EntryId::parse(&id.to_string()).ok_or(()), Some(id))?;
        }

        #[test]
        fn entry_ids_beyond_u64_are_refused(big in beyond_u64(), small: u64) {
            for text in [format!("{big}-{small}"), format!("{small}-{big}"), big.clone()] {
                expect(&text, EntryId::parse(&text).ok_or(()), None)?;
            }
        }
    }

    #[track_caller]
    fn check_id(id: &str, ok: bool) {
        assert_eq!(MessageId::parse(id).is_ok(), ok, "id {id:?}");
    }

    #[test]
    fn ids() {
        check_id("order-42", true);
        check_id("a.b_c:d-e", true);
        check_id(&"x".repeat(128), true);
        check_id(&"x".repeat(129), false);
        check_id("", false);
        check_id("has space", false);
        check_id("slash/no", false);
        check_id("ünï", false);
        check_id(MessageId::generate().as_str(), true);
    }

    #[test]
    fn generated_ids_sort_by_time() {
        let a = MessageId::generate();
        std::thread::sleep(Duration::from_millis(2));
        let b = MessageId::generate();
        assert!(a < b, "{a} < {b}");
    }

    #[test]
    fn generated_ids_come_in_the_order_made_and_spread_over_shards() {
        // Many ids a millisecond, as a busy producer makes them: strictly
        // increasing, yet spread over the shards as evenly as random ones.
        let ids: Vec<MessageId> = (0..16_000).map(|_| MessageId::generate()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "not in the order made");
        let mut seen = [0u32; 16];
        for id in &ids {
            seen[id.shard(16) as usize] += 1;
        }
        assert!(
            seen.iter().all(|&n| (800..1200).contains(&n)),
            "uneven spread: {seen:?}"
        );
    }

    #[test]
    fn shards_are_stable_and_spread() {
        let id = MessageId::parse("order-42").unwrap();
        assert_eq!(id.shard(16), id.shard(16));
        let mut seen = [0u32; 16];
        for i in 0..1600 {
            seen[MessageId::parse(&format!("m{i}")).unwrap().shard(16) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "uneven spread: {seen:?}");
    }
}
