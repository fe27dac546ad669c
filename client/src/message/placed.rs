//! Ids that name where their message is: `d`, the message's due-set score in 12 hex
//! digits, then a count of 16 characters (Crockford's base 32, as a ULID's random
//! part). The store keeps an index entry (id -> score) for every message in the
//! compact pending layout, so that an id finds its message; a message whose id names
//! its score needs none, and Redis is spared that write on the push and its delete
//! on the forward (`placed_score` in the scripts' prelude, which reads this format).
//!
//! The count starts at random in each process and goes up by one an id, so ids made
//! later sort after those made before (messages with one score are delivered in the
//! order made) and two processes meet only by chance (2^80 values). As with ULIDs,
//! the ids a millisecond makes go to one shard: the count steps up until the text
//! lands in the shard of its millisecond's first id.

use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use ulid::Ulid;

use super::made::{MsShard, keep_in_ms_shard};

/// The number of characters of a placed id.
pub const PLACED_LEN: usize = 29;

/// The highest score a placed id can name (12 hex digits): due times before the
/// year 2800 or so.
const MAX_SCORE: u64 = (1 << 48) - 1;

/// The count's values: 80 bits.
const COUNT_MASK: u128 = (1 << 80) - 1;

static COUNT: Mutex<Option<Count>> = Mutex::new(None);

struct Count {
    next: u128,
    shard: MsShard,
}

/// Crockford's base 32, as ULIDs write it.
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// The id's text but its count.
fn head(score: u64) -> [u8; PLACED_LEN] {
    let mut text = [0u8; PLACED_LEN];
    text[0] = b'd';
    let mut s = score;
    for b in text[1..13].iter_mut().rev() {
        *b = b"0123456789abcdef"[(s & 15) as usize];
        s >>= 4;
    }
    text
}

/// Writes the count's 80 bits as the last 16 characters.
fn set_count(text: &mut [u8; PLACED_LEN], count: u128) {
    let mut c = count;
    for b in text[13..].iter_mut().rev() {
        *b = CROCKFORD[(c & 31) as usize];
        c >>= 5;
    }
}

/// A fresh id naming `score` (see the module), in the shard (of `shards`) of the ids
/// made before it in its millisecond where it finds it; None for a score too high to
/// name.
pub(super) fn make(score: u64, shards: u16) -> Option<String> {
    if score > MAX_SCORE {
        return None;
    }
    let mut count = COUNT.lock().unwrap_or_else(PoisonError::into_inner);
    let Count { next, shard } = count.get_or_insert_with(|| Count {
        next: rand_count(),
        shard: None,
    });
    let mut take = |text: &mut [u8; PLACED_LEN]| {
        set_count(text, *next);
        *next = (*next + 1) & COUNT_MASK;
        true
    };
    let mut id = head(score);
    take(&mut id);
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let shard_of = |text: &[u8; PLACED_LEN]| super::shard_of_text(text, shards);
    keep_in_ms_shard(shard, ms, shards, &mut id, shard_of, take);
    Some(id.iter().map(|&b| char::from(b)).collect())
}

/// The count's random start: a ULID's random part.
fn rand_count() -> u128 {
    Ulid::new().random()
}

/// The score an id names, if it is of the placed shape (whoever made it).
pub fn placed_score(id: &str) -> Option<u64> {
    if id.len() != PLACED_LEN || !id.starts_with('d') {
        return None;
    }
    let hex = id.get(1..13)?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::message::{MessageId, due_score};

    proptest! {
        #[test]
        fn an_id_names_its_score_and_is_a_valid_id(score in 0..=MAX_SCORE, shards in 1u16..64) {
            let id = make(score, shards).unwrap();
            prop_assert_eq!(id.len(), PLACED_LEN);
            prop_assert_eq!(placed_score(&id), Some(score));
            prop_assert!(MessageId::parse(&id).is_ok(), "{}", id);
        }

        #[test]
        fn other_shapes_name_no_score(id in "[A-Za-z0-9._:-]{1,40}") {
            if let Some(score) = placed_score(&id) {
                prop_assert!(id.len() == PLACED_LEN && id.starts_with('d'));
                prop_assert_eq!(format!("{score:012x}"), id[1..13].to_ascii_lowercase());
            }
        }
    }

    #[test]
    fn the_count_is_written_as_a_ulids_random_part() {
        for count in [0, 1, 31, 32, 1 << 40, COUNT_MASK] {
            let mut text = head(0xabc);
            set_count(&mut text, count);
            let ulid = Ulid::from_parts(0, count).to_string();
            assert_eq!(&text[..13], b"d000000000abc");
            assert_eq!(&text[13..], &ulid.as_bytes()[10..], "{count}");
        }
    }

    #[test]
    fn scores_too_high_to_name_make_no_id() {
        assert!(make(MAX_SCORE + 1, 1).is_none());
        assert!(make(u64::MAX, 16).is_none());
        assert!(make(MAX_SCORE, 16).is_some());
    }

    #[test]
    fn ids_of_one_score_come_in_the_order_made() {
        let score = due_score(1_800_000_000_000, 3);
        let ids: Vec<String> = (0..2000).map(|_| make(score, 16).unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "not in the order made");
    }

    #[test]
    fn ids_made_in_one_millisecond_mostly_share_a_shard() {
        // Consecutive ids change shard when their millisecond does, or when the
        // count's steps run out (a few percent of ids with 16 shards).
        let started = SystemTime::now();
        let shards: Vec<u16> = (0..2000)
            .map(|i| super::super::shard_of_text(make(i, 16).unwrap().as_bytes(), 16))
            .collect();
        let ms = started.elapsed().unwrap().as_millis() as usize;
        let changes = shards.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(
            changes <= ms + 1 + shards.len() / 20,
            "{changes} changes of shard over {ms} ms"
        );
        let spread: HashMap<u16, usize> = (0..400u64)
            .map(|i| {
                std::thread::sleep(std::time::Duration::from_micros(1100));
                (
                    super::super::shard_of_text(make(i, 16).unwrap().as_bytes(), 16),
                    1,
                )
            })
            .collect();
        assert!(spread.len() >= 12, "shards seen over 400 ms: {spread:?}");
    }
}
