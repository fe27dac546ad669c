//! Counting what is scheduled, against a real Redis: per stream, over the shards a
//! caller names.

use std::collections::BTreeMap;
use std::time::Duration;

use delayq_client::message::{MessageId, NewMessage};
use delayq_client::store::BatchItem;

use crate::support::{Bare, schedule_new, script_calls};

const DAY: Duration = Duration::from_secs(86_400);

/// A count per stream over the shards named reads theirs alone, and over none makes
/// no call (what an idle leader's count asks once it has found every shard empty).
#[tokio::test]
async fn a_count_per_stream_reads_only_the_shards_named() {
    let bare = Bare::start("[redis]\nshards = 4\n").await;
    let store = &bare.store;
    let mut conn = bare.redis.client();
    let mut per_shard = [0u64; 4];
    // Each message goes to the stream named after its shard.
    let items: Vec<BatchItem> = (0..40)
        .map(|n| {
            let id = MessageId::parse(&format!("m{n}")).unwrap();
            let shard = id.shard(4);
            per_shard[usize::from(shard)] += 1;
            let mut msg = NewMessage::payload(&format!("s{shard}"), "p", Duration::from_secs(3600));
            msg.id = id;
            BatchItem::new(msg)
        })
        .collect();
    schedule_new(store, &items, DAY).await;

    let before = script_calls(&mut conn);
    let none = store
        .pending_per_stream_in(&[], usize::MAX, 0)
        .await
        .unwrap();
    assert!(
        none.per_stream.is_empty() && none.exact,
        "{:?}",
        none.per_stream
    );
    assert_eq!(script_calls(&mut conn), before, "script calls for no shard");

    let some = store
        .pending_per_stream_in(&[1, 2], usize::MAX, 0)
        .await
        .unwrap();
    let want: BTreeMap<String, u64> = [1usize, 2]
        .into_iter()
        .filter(|&s| per_shard[s] > 0)
        .map(|s| (format!("s{s}"), per_shard[s]))
        .collect();
    assert_eq!(some.per_stream, want);

    let all = store.pending_per_stream(usize::MAX, 0).await.unwrap();
    assert_eq!(all.per_stream.values().sum::<u64>(), 40);
    assert_eq!(
        all.per_stream.len(),
        per_shard.iter().filter(|&&n| n > 0).count()
    );
}
