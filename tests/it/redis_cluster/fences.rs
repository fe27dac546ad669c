//! Fencing on Redis Cluster: each slot in use has its own fence, in its own slot,
//! so a forward is checked against the fence beside the messages it moves. A stale
//! leader is refused in every slot, and with several groups a group's new epoch
//! fences its own slots only.

use delayq_client::store::{Store, StoreError};

use super::forwarding::{messages, schedule_all};
use super::{cluster_config, reader, shared_cluster};
use crate::support::now_ms;
use crate::support::xlen;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_leader_is_refused_in_every_slot_and_a_group_fences_only_its_own() {
    let cluster = shared_cluster();
    let config = cluster_config(&cluster, "fences", "");
    let store = Store::connect(&config.store_config())
        .await
        .expect("connect");
    let options = config.forward_options();
    let mut conn = reader(&cluster);
    // Two streams, each in its own slot.
    let streams: Vec<String> = ["fences-a", "fences-c"].map(str::to_owned).into();
    let items = messages("f", 2, &streams, now_ms() - 1000, 1);
    schedule_all(&store, &items).await;
    let [a, b] = [0, 1].map(|i| store.shard_of(&items[i].msg.id, &streams[i]));
    assert_ne!(a, b);

    // A leader with epoch 5 fences both slots; one with epoch 4 is refused in
    // each, and moves nothing.
    store.raise_fences(5).await.unwrap();
    for shard in [a, b] {
        match store.forward(shard, 4, &options).await {
            Err(StoreError::Fenced { held: 5, caller: 4 }) => {}
            other => panic!("slot {shard}: expected FENCED, got {other:?}"),
        }
        assert!(matches!(
            store.trim_records(shard, 4, 10).await,
            Err(StoreError::Fenced { held: 5, caller: 4 })
        ));
    }
    assert_eq!(
        xlen(&mut conn, &streams[0]) + xlen(&mut conn, &streams[1]),
        0
    );

    // Two groups: the first's new leader (epoch 9) raises its slot's fence only.
    // The second group's leader (epoch 7) still moves its slot; the first group's
    // old leader (5) is refused in its own, however it was fenced before.
    let first = store.owning(vec![a]);
    first.raise_fences(9).await.unwrap();
    assert!(matches!(
        store.forward(a, 7, &options).await,
        Err(StoreError::Fenced { held: 9, caller: 7 })
    ));
    assert_eq!(store.forward(b, 7, &options).await.unwrap().forwarded, 1);
    assert!(matches!(
        store.forward(b, 5, &options).await,
        Err(StoreError::Fenced { held: 7, caller: 5 })
    ));
    assert_eq!(xlen(&mut conn, &streams[0]), 0);
    assert_eq!(xlen(&mut conn, &streams[1]), 1);
    // A group's leader cannot take back a fence a newer one raised.
    assert!(matches!(
        first.raise_fences(8).await,
        Err(StoreError::Fenced { held: 9, .. })
    ));
    assert_eq!(first.forward(a, 9, &options).await.unwrap().forwarded, 1);
    assert_eq!(xlen(&mut conn, &streams[0]), 1);
    assert_eq!(store.highest_fence().await.unwrap(), 9);
}
