//! What the drill asks the nodes: who leads (`/leader`), whether they are
//! healthy, and how long until a takeover.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Deserialize;

use super::load::Traffic;
use super::report::ms;
use super::target::Node;
use delayq_client::store::{Store, StoreError};

/// The part of a leader's `/leader` answer the drill reads.
#[derive(Deserialize)]
struct Leading {
    epoch: u64,
}

/// Epoch of `node` if it answers `/leader` with 200 (it leads).
pub(super) async fn leads(http: &reqwest::Client, node: &Node) -> Option<u64> {
    let resp = http
        .get(format!("{}/leader", node.url))
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .ok()?;
    if resp.status() != 200 {
        return None;
    }
    resp.json::<Leading>().await.ok().map(|l| l.epoch)
}

pub(super) async fn leaders(http: &reqwest::Client, nodes: &[Node]) -> Vec<(usize, u64)> {
    let answers = futures::future::join_all(nodes.iter().map(|n| leads(http, n))).await;
    answers
        .into_iter()
        .enumerate()
        .filter_map(|(i, e)| e.map(|e| (i, e)))
        .collect()
}

pub(super) async fn wait_single_leader(
    http: &reqwest::Client,
    nodes: &[Node],
    timeout: Duration,
) -> anyhow::Result<(usize, u64)> {
    let give_up = Instant::now() + timeout;
    loop {
        let seen = leaders(http, nodes).await;
        if let [(i, epoch)] = seen[..] {
            return Ok((i, epoch));
        }
        if seen.len() > 1 && per_shard(http, nodes).await {
            bail!(
                "the nodes lead election groups side by side (election.mode = \"per_shard\"): \
                 the drill drives single-leader deployments (election.mode = \"single\")"
            );
        }
        if Instant::now() > give_up {
            bail!("no single leader within {}: {seen:?}", ms(timeout));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a node says it elects per group of shards (`groups` in `/v1/leader`),
/// where several nodes lead at once by design.
async fn per_shard(http: &reqwest::Client, nodes: &[Node]) -> bool {
    for node in nodes {
        let view = match http.get(format!("{}/v1/leader", node.url)).send().await {
            Ok(resp) => resp.json::<serde_json::Value>().await.ok(),
            Err(_) => None,
        };
        if view.is_some_and(|v| v["groups"].as_array().is_some_and(|g| !g.is_empty())) {
            return true;
        }
    }
    false
}

/// The instant a node other than `old` leads under an epoch above `epoch`.
pub(super) async fn wait_takeover(
    http: &reqwest::Client,
    nodes: &[Node],
    old: usize,
    epoch: u64,
    timeout: Duration,
) -> Option<Instant> {
    let give_up = Instant::now() + timeout;
    let others: Vec<Node> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != old)
        .map(|(_, n)| n.clone())
        .collect();
    while Instant::now() < give_up {
        let seen = leaders(http, &others).await;
        if seen.iter().any(|(_, e)| *e > epoch) {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Watches leadership for `period`: the longest stretch without any leader, and
/// whether the epoch changed.
pub(super) async fn watch_leadership(
    http: &reqwest::Client,
    nodes: &[Node],
    epoch: u64,
    period: Duration,
) -> (Duration, bool) {
    let started = Instant::now();
    let mut longest = Duration::ZERO;
    let mut leaderless_since: Option<Instant> = None;
    let mut changed = false;
    while started.elapsed() < period {
        let seen = leaders(http, nodes).await;
        let now = Instant::now();
        if seen.is_empty() {
            leaderless_since.get_or_insert(now);
        } else {
            if let Some(since) = leaderless_since.take() {
                longest = longest.max(now - since);
            }
            changed |= seen.iter().any(|(_, e)| *e != epoch);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(since) = leaderless_since {
        longest = longest.max(Instant::now() - since);
    }
    (longest, changed)
}

/// Waits until every node answers `/healthz` and exactly one leads.
pub(super) async fn settle(
    http: &reqwest::Client,
    nodes: &[Node],
    traffic: &Traffic,
    timeout: Duration,
) -> anyhow::Result<()> {
    let give_up = Instant::now() + timeout;
    loop {
        let healthy = futures::future::join_all(nodes.iter().map(|n| async move {
            http.get(format!("{}/healthz", n.url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        }))
        .await;
        for (i, ok) in healthy.iter().enumerate() {
            if *ok {
                traffic.set_up(i, true);
            }
        }
        let seen = leaders(http, nodes).await;
        if healthy.iter().all(|h| *h) && seen.len() == 1 {
            return Ok(());
        }
        if Instant::now() > give_up {
            bail!(
                "after {}: healthy {healthy:?}, leaders {seen:?}",
                ms(timeout)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the replicas of the Redis master, the old master among them, are
/// replicas in sync with it (see [`Store::sentinel_replicas_in_sync`]): Sentinel
/// makes the old master one some seconds after a switch, and a failover before
/// that could promote it with what it had and discard what the new master took.
pub(super) async fn redis_settled(store: &Store, timeout: Duration) -> anyhow::Result<()> {
    let give_up = Instant::now() + timeout;
    loop {
        let answer = store.sentinel_replicas_in_sync().await;
        if matches!(answer, Ok(true)) {
            return Ok(());
        }
        if Instant::now() > give_up {
            let why = answer.map_or_else(|e| e.to_string(), |_| "not yet".to_owned());
            bail!(
                "the Redis replicas were not in sync with the new master within {}: {why}",
                ms(timeout)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether Sentinel refused a failover for now: one is under way (`INPROG`), or
/// no replica is fit yet (`NOGOODSLAVE`: the last round's old master is not yet
/// a replica in sync that the Sentinels know).
fn not_yet(e: &StoreError) -> bool {
    matches!(e, StoreError::Redis(e) if matches!(e.code(), Some("INPROG" | "NOGOODSLAVE")))
}

/// Asks Sentinel for a failover (again while it answers "not yet", until
/// `timeout`), then measures from the failover it took until `stream` holds an
/// entry written on the new master: how long forwarding stood still. None if it
/// did not resume within `timeout`.
pub(super) async fn redis_failover(
    store: &Store,
    stream: &str,
    timeout: Duration,
) -> anyhow::Result<Option<Duration>> {
    let mut moves = store
        .master_changes()
        .context("the drill's connection to Redis does not go through Sentinel")?;
    let before = moves.borrow().0;
    let give_up = Instant::now() + timeout;
    loop {
        match store.sentinel_failover().await {
            Ok(()) => break,
            Err(e) if not_yet(&e) && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context("SENTINEL FAILOVER"),
        }
    }
    let started = Instant::now();
    let resumed = async {
        // The drill's own connection follows the switch (Sentinel announces it);
        // from then on its reads go to the new master.
        let _ = moves.wait_for(|(n, _)| *n > before).await;
        let first = loop {
            match store.last_entry_id(stream).await {
                Ok(last) => break last,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        loop {
            if let Ok(last) = store.last_entry_id(stream).await
                && last != first
            {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    Ok(tokio::time::timeout(timeout, resumed).await.ok())
}
