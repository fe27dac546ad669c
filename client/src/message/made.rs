//! Ids this process makes: ULIDs, each above the one before, and those of one
//! millisecond in one shard.
//!
//! A push call into Redis pays for every shard it stores into (the shard's fence,
//! its index header, the end of its last bucket), more than for a message. Pushes
//! that arrive together share a call, so when their ids put them in one shard the
//! call pays that once, where ids spread at random over 16 shards made it pay for
//! most of them. So the first id made in a millisecond picks its shard at random,
//! as any ULID does, and the ids made after it in that millisecond count up from
//! it to the next one that lives in the same shard. Over many milliseconds the
//! shards get even shares, as before.

use std::sync::{Mutex, PoisonError};

use ulid::Ulid;

/// The most steps an id counts up looking for its millisecond's shard before it
/// takes the one it reached: with 16 shards it finds it within 64 in 98% of ids, and
/// a step costs tens of nanoseconds; with hundreds of shards it gives up most times
/// (no harm: the id is as good, its call only pays for one more shard).
const MAX_STEPS: u32 = 64;

static MADE: Mutex<Made> = Mutex::new(Made {
    last: None,
    shard: None,
});

struct Made {
    /// The last id made in order.
    last: Option<Ulid>,
    /// The shard the ids of a millisecond go to: (ms, shards, shard).
    shard: MsShard,
}

/// The shard of an id (as [`super::MessageId::shard`] reads it), without its text.
fn shard_of(id: Ulid, shards: u16) -> u16 {
    let mut text = [0u8; ulid::ULID_LEN];
    id.array_to_str(&mut text);
    super::shard_of_text(&text, shards)
}

/// A fresh ULID above every one this process made before it, in the shard (of
/// `shards`) of the ids made before it in its millisecond where it finds it (see
/// the module). Should the count run out within one millisecond (2^80 ids from a
/// random start), the id is random, out of that order.
pub(super) fn make(shards: u16) -> Ulid {
    let mut made = MADE.lock().unwrap_or_else(PoisonError::into_inner);
    let random = Ulid::new();
    let mut id = match made.last {
        // The same millisecond, or a clock that stepped back: count up.
        Some(last) if random.timestamp_ms() <= last.timestamp_ms() => match last.increment() {
            Some(next) => next,
            None => return random,
        },
        _ => random,
    };
    let in_shard = keep_in_ms_shard(
        &mut made.shard,
        id.timestamp_ms(),
        shards,
        &mut id,
        |id| shard_of(*id, shards),
        |id| id.increment().map(|next| *id = next).is_some(),
    );
    if !in_shard {
        return random;
    }
    made.last = Some(id);
    id
}

/// The shard the ids of a millisecond go to: (ms, shards, shard).
pub(super) type MsShard = Option<(u64, u16, u16)>;

/// Steps `id` up (`step`, false once it cannot) until `shard_of` puts it in the
/// shard of the ids made before it in millisecond `ms`, at most [`MAX_STEPS`] times
/// (then it stays where it got); the first id of a millisecond sets that shard in
/// `slot`. False when `step` ran out.
pub(super) fn keep_in_ms_shard<T>(
    slot: &mut MsShard,
    ms: u64,
    shards: u16,
    id: &mut T,
    shard_of: impl Fn(&T) -> u16,
    mut step: impl FnMut(&mut T) -> bool,
) -> bool {
    if shards <= 1 {
        return true;
    }
    match *slot {
        Some((at, of, shard)) if at == ms && of == shards => {
            for _ in 0..MAX_STEPS {
                if shard_of(id) == shard {
                    break;
                }
                if !step(id) {
                    return false;
                }
            }
        }
        _ => *slot = Some((ms, shards, shard_of(id))),
    }
    true
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::time::Duration;

    use super::*;
    use crate::message::MessageId;

    #[test]
    fn the_shard_read_off_an_id_is_the_shard_of_its_text() {
        for shards in [1, 2, 16, 1024] {
            for _ in 0..100 {
                let id = Ulid::new();
                let text = MessageId::parse(&id.to_string()).unwrap();
                assert_eq!(shard_of(id, shards), text.shard(shards), "{id} of {shards}");
            }
        }
    }

    #[test]
    fn ids_made_in_one_millisecond_share_a_shard_and_count_up() {
        // Tests run side by side and make ids too: only runs of this test's own
        // ids in a millisecond, made one after another, are asked to share.
        let ids: Vec<Ulid> = (0..4000).map(|_| make(16)).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "not in the order made");
        let mut by_ms: HashMap<u64, Vec<u16>> = HashMap::new();
        for id in &ids {
            by_ms
                .entry(id.timestamp_ms())
                .or_default()
                .push(shard_of(*id, 16));
        }
        let (mut shared, mut all) = (0, 0);
        for shards in by_ms.values() {
            let mut count: HashMap<u16, usize> = HashMap::new();
            for s in shards {
                *count.entry(*s).or_default() += 1;
            }
            shared += count.values().max().unwrap();
            all += shards.len();
        }
        assert!(
            shared * 100 >= all * 95,
            "{shared} of {all} ids share their millisecond's shard"
        );
    }

    #[test]
    fn milliseconds_spread_over_every_shard() {
        let mut seen = HashSet::new();
        for _ in 0..400 {
            seen.insert(shard_of(make(16), 16));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(seen.len(), 16, "shards seen: {seen:?}");
    }

    #[test]
    fn one_shard_or_many_takes_the_id_as_it_comes() {
        for shards in [1, 4096] {
            let a = make(shards);
            let b = make(shards);
            assert!(a < b, "{a} < {b} ({shards} shards)");
        }
    }
}
