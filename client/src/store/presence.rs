//! Presence: a node's sign of life in Redis, and the signs a standby reads of the
//! leader's.
//!
//! Every node in an etcd election holds one connection of its own, subscribed to
//! the presence channel of the etcd lease it campaigns or leads with. A
//! subscription lives exactly as long as its connection: when the process dies,
//! the kernel closes the socket and Redis drops the subscriber at once, so
//! `PUBSUB NUMSUB` of the leader's channel falls to 0 within milliseconds of a
//! crash, long before etcd expires the lease. A leader cut off from Redis while its
//! connection looks open to Redis (packets lost, not refused) shows instead in its
//! health probe key, which stops being written: the key's remaining time to live
//! says how long ago it last was.
//!
//! On Redis Cluster, where `PUBSUB NUMSUB` counts only the subscribers of the node
//! asked, every node subscribes on the master of one slot (`Keys::presence_slot`,
//! found by asking that master's `CLUSTER SLOTS`, and asked again at every ping so
//! that a subscription follows the slot when it moves) and standbys ask that
//! master; the probe keys live in that slot too.

use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use redis::Value;

use super::reply::int_at;
use super::{PROBE_TTL_MS, Result, Store};
use crate::backoff::Backoff;
use Broken::{Lost, Moved};

/// How often the presence connection is pinged, so a connection Redis dropped is
/// noticed and made again soon.
const PING_EVERY: Duration = Duration::from_millis(500);

/// A presence held on a live subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// The etcd lease whose channel is subscribed.
    pub lease: i64,
    /// When the connection holding it was made: a standby judges others only once
    /// its own connection is old enough for theirs to have been made again too
    /// (after a Redis restart, everybody reconnects).
    pub since: Instant,
}

/// What Redis shows of a leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderSigns {
    /// Whether a connection is subscribed to the leader's presence channel.
    pub present: bool,
    /// How long ago the leader's health probe last wrote (None: no probe key).
    pub probe_age: Option<Duration>,
}

impl Store {
    /// Holds this node's presence until `cancel`: subscribes to the channel of the
    /// lease `want` names (none: no subscription), says on `held` what is
    /// subscribed, and makes the connection again whenever it breaks.
    pub async fn hold_presence(
        &self,
        mut want: watch::Receiver<Option<i64>>,
        held: watch::Sender<Option<Held>>,
        cancel: CancellationToken,
    ) {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
        let mut moves = self.conn.master_changes();
        loop {
            let since = Instant::now();
            // The master this connection is made to (through Sentinel): a later
            // move makes it again (see `moved`).
            if let Some(moves) = moves.as_mut() {
                moves.borrow_and_update();
            }
            let slot = self.keys.presence_slot();
            let connected =
                tokio::time::timeout(self.response_timeout, self.conn.pubsub_on_master_of(slot))
                    .await;
            let (mut pubsub, at) = match connected {
                Ok(Ok(connected)) => connected,
                failed => {
                    if let Ok(Err(e)) = failed {
                        tracing::debug!(error = %e, "cannot connect for presence; retrying");
                    }
                    held.send_replace(None);
                    if sleep_or_cancel(backoff.next_delay(), &cancel).await {
                        return;
                    }
                    continue;
                }
            };
            let mut subscribed: Option<i64> = None;
            let broken = loop {
                let lease = *want.borrow_and_update();
                if lease != subscribed {
                    held.send_replace(None);
                    if let Err(why) = self.resubscribe(&mut pubsub, &mut subscribed, lease).await {
                        break Lost(why);
                    }
                    if let Some(lease) = subscribed {
                        held.send_replace(Some(Held { lease, since }));
                    }
                    backoff.reset();
                }
                tokio::select! {
                    _ = cancel.cancelled() => {
                        held.send_replace(None);
                        return;
                    }
                    changed = want.changed() => if changed.is_err() {
                        held.send_replace(None);
                        return;
                    },
                    () = moved(&mut moves) => break Moved,
                    _ = tokio::time::sleep(PING_EVERY) => {
                        if !answers_ping(&mut pubsub, self.response_timeout).await {
                            break Lost("ping failed");
                        }
                        if self.presence_moved(slot, &at).await {
                            break Lost("the presence slot has another master now");
                        }
                    }
                }
            };
            held.send_replace(None);
            let Lost(why) = broken else {
                // Made again on the new master at once; this one stays subscribed a
                // while for those not yet following (see `linger`).
                tracing::debug!("the Redis master moved: presence made again there");
                let (store, want, cancel) = (self.clone(), want.clone(), cancel.clone());
                tokio::spawn(async move { store.linger(pubsub, subscribed, want, cancel).await });
                continue;
            };
            tracing::debug!(why, "presence connection lost; connecting again");
            drop(pubsub);
            if sleep_or_cancel(backoff.next_delay(), &cancel).await {
                return;
            }
        }
    }

    /// Redis Cluster: whether the presence slot's master is no longer the node at
    /// `at`, where this node's presence is subscribed (after a slot migration, say:
    /// a failover breaks the connection itself). False when unknown.
    async fn presence_moved(&self, slot: u16, at: &Option<(String, u16)>) -> bool {
        let Some(at) = at else {
            return false;
        };
        let now = tokio::time::timeout(self.response_timeout, self.conn.master_address(slot)).await;
        matches!(now, Ok(Ok(Some(now))) if now != *at)
    }

    /// Subscribes `pubsub`, now subscribed to the presence channel of `subscribed`
    /// (if any), to that of `lease` (if any) instead. Err says which call failed.
    async fn resubscribe(
        &self,
        pubsub: &mut redis::aio::PubSub,
        subscribed: &mut Option<i64>,
        lease: Option<i64>,
    ) -> std::result::Result<(), &'static str> {
        if let Some(old) = subscribed.take() {
            let channel = self.keys.presence_channel(old);
            let r = tokio::time::timeout(self.response_timeout, pubsub.unsubscribe(channel)).await;
            if !matches!(r, Ok(Ok(()))) {
                return Err("unsubscribe failed");
            }
        }
        if let Some(new) = lease {
            let channel = self.keys.presence_channel(new);
            let r = tokio::time::timeout(self.response_timeout, pubsub.subscribe(channel)).await;
            if !matches!(r, Ok(Ok(()))) {
                return Err("subscribe failed");
            }
            *subscribed = Some(new);
        }
        Ok(())
    }

    /// Keeps `pubsub`, on the master this node just moved away from, subscribed to
    /// the presence channel of whichever lease `want` names (it is subscribed to
    /// `subscribed`'s now), until that connection breaks (Sentinel reconfigures the
    /// old master, or it goes away), `cancel`, or [`LINGER`] has passed. Nodes
    /// follow a move each when their own Sentinel tells them (Sentinels learn of a
    /// failover they did not lead up to seconds later): a standby that has not
    /// followed yet still asks the old master, and must not take the leader's
    /// having followed for its death. Nor a new leader's: the switch ends the
    /// leader's term, and a node that campaigns again does so with a new lease,
    /// which is why the lease followed here is the one wanted now, not the one
    /// held at the move. A process that dies closes both connections.
    async fn linger(
        &self,
        mut pubsub: redis::aio::PubSub,
        mut subscribed: Option<i64>,
        mut want: watch::Receiver<Option<i64>>,
        cancel: CancellationToken,
    ) {
        let until = tokio::time::Instant::now() + LINGER;
        loop {
            let lease = *want.borrow_and_update();
            if lease != subscribed
                && self
                    .resubscribe(&mut pubsub, &mut subscribed, lease)
                    .await
                    .is_err()
            {
                return;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                () = tokio::time::sleep_until(until) => return,
                changed = want.changed() => if changed.is_err() {
                    return;
                },
                _ = tokio::time::sleep(PING_EVERY) => {
                    if !answers_ping(&mut pubsub, self.response_timeout).await {
                        return;
                    }
                }
            }
        }
    }

    /// What Redis shows of the leader (holding `lease` as node `leader`) and of
    /// this node (holding `own_lease` as node `own`): whether each one's presence is
    /// subscribed, and how long ago each one's probe wrote.
    pub async fn leader_signs(
        &self,
        (lease, leader): (i64, &str),
        (own_lease, own): (i64, &str),
    ) -> Result<(LeaderSigns, LeaderSigns)> {
        let mut conn = self.conn.clone();
        // One pipeline: on Redis Cluster it goes to the master of its keys' slot,
        // the presence slot (NUMSUB names no key), which is where every presence is
        // subscribed and NUMSUB counts that node's own subscribers.
        let (numsub, leader_pttl, own_pttl): (Vec<Value>, i64, i64) = redis::pipe()
            .cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(self.keys.presence_channel(lease))
            .arg(self.keys.presence_channel(own_lease))
            .cmd("PTTL")
            .arg(self.keys.write_probe(leader))
            .cmd("PTTL")
            .arg(self.keys.write_probe(own))
            .query_async(&mut conn)
            .await?;
        // NUMSUB answers channel, count, channel, count.
        let subscribed = |i: usize| -> Result<bool> { Ok(int_at(&numsub, i)? > 0) };
        Ok((
            LeaderSigns {
                present: subscribed(1)?,
                probe_age: probe_age(leader_pttl),
            },
            LeaderSigns {
                present: subscribed(3)?,
                probe_age: probe_age(own_pttl),
            },
        ))
    }
}

/// Resolves when Sentinel names another master than the last one seen on
/// `moves`; never on one Redis or Redis Cluster. A presence stays on the master it
/// was subscribed on until its connection breaks, and a master demoted in a
/// planned failover goes on answering (Sentinel breaks its connections only when
/// it reconfigures it, seconds later): meanwhile the standbys, asking the new
/// master, would see neither their own presence nor the leader's, and a crash
/// would wait out the lease. So the presence is made again on the new master as
/// soon as this node follows the move.
async fn moved(moves: &mut Option<watch::Receiver<(u64, String)>>) {
    if let Some(moves) = moves
        && moves.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Why the presence loop makes its connection again.
enum Broken {
    /// Lost (why): made again after a backoff pause.
    Lost(&'static str),
    /// The master moved (Sentinel): made again there at once.
    Moved,
}

/// Whether `pubsub` answers a ping within `timeout`.
async fn answers_ping(pubsub: &mut redis::aio::PubSub, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, pubsub.ping::<Value>()).await,
        Ok(Ok(_))
    )
}

/// How long a presence stays on a master this node moved away from (see
/// [`Store::linger`]): longer than Sentinels take to learn of a failover from each other
/// (their hello messages go every 2 s), and about as long as Sentinel waits before
/// it reconfigures a demoted master that is still up (8 s), which ends it sooner.
const LINGER: Duration = Duration::from_secs(10);

/// How long ago a key written with [`PROBE_TTL_MS`] was written, from its PTTL
/// (negative: no such key, or one without an expiry).
fn probe_age(pttl: i64) -> Option<Duration> {
    let left = u64::try_from(pttl).ok()?;
    Some(Duration::from_millis(PROBE_TTL_MS.saturating_sub(left)))
}

/// Sleeps for `delay`; true when cancelled first.
async fn sleep_or_cancel(delay: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => true,
        _ = tokio::time::sleep(delay) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_age_reads_the_time_to_live_left() {
        let ms = Duration::from_millis;
        assert_eq!(probe_age(60_000), Some(ms(0)));
        assert_eq!(probe_age(57_500), Some(ms(2_500)));
        assert_eq!(probe_age(0), Some(ms(60_000)));
        assert_eq!(probe_age(-2), None);
        assert_eq!(probe_age(-1), None);
        assert_eq!(probe_age(70_000), Some(ms(0)));
    }
}
