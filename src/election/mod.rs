//! Leadership through etcd: the only module that speaks etcd.
//!
//! [`run`] is one loop per process. Each round it grants a lease, keeps it alive
//! from its own timer, campaigns on `etcd.election_prefix` (etcd's v3 election
//! API), and leads while the lease holds and its leader key exists. The epoch of a
//! term is the leader key's create revision, which only grows from one leader to
//! the next. Any sign that the term is over ends it at once (the role goes to
//! `Follower` before anything else is tried); the round then resigns, revokes its
//! lease and the next round campaigns again with a fresh lease.
//!
//! The lease is judged locally, on the monotonic clock: each renewal etcd
//! confirms moves a deadline to `time the renewal was sent + granted TTL − margin`.
//! etcd cannot expire the lease before that instant, so a leader that stops at
//! its deadline stops before anybody else can be elected. With `etcd.failsafe`, a
//! leader whose renewals fail because etcd does not answer at all (errors,
//! timeouts) keeps leading past the deadline: while etcd is unreachable nobody can
//! be elected, and if somebody is (only this node was cut off), that leader's
//! fence refuses this one's scripts and the forwarder reports `FENCED`. Any
//! *answer* from etcd that the lease or the key is gone ends the term.
//!
//! Layout: this file is the round loop (`run`, `Node`: grant, then campaign and
//! lead); `campaign.rs` the presence and the campaign; `lead.rs` the term and the
//! lease given back after it; `lease.rs` the lease's timings, local deadline, failsafe rule and
//! keepalive task; `key.rs` the leader key's check and watch while leading;
//! `observe.rs` who leads as etcd says, for every node and for `delayq fence show`.

use std::future::Future;
use std::time::{Duration, SystemTime};

use anyhow::anyhow;
use etcd_client::{
    Certificate, Client, ConnectOptions, EventType, GetOptions, Identity, LeaderKey, ResignOptions,
    SortOrder, SortTarget, TlsOptions, WatchOptions, WatchStream,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::backoff::Backoff;
use crate::complaint::Complaint;
use crate::config::{EtcdConfig, EtcdTls};
use crate::leadership::{Elector, LeaderInfo, Role, StepDown, Term};
use crate::metrics as m;
use crate::store::{Held, Store};

mod balance;
mod campaign;
mod client;
mod key;
mod lead;
mod lease;
mod observe;
mod takeover;

pub use balance::{balance, group_config};
use client::*;
use key::*;
use lead::RESIGN_PAUSE;
use lease::*;
use observe::observe_leader;
pub use observe::{ElectionView, candidates, view};
pub use takeover::{LEADER_IN_SIGHT, SILENT};

// What the election's retries log: one line per condition for the process, the
// place of a failure its election group (0 in the single-leader mode).
static NO_CLIENT: Complaint = Complaint::across(
    "group",
    "cannot set up the etcd client; retrying",
    "the etcd client is set up",
);
static NO_LEASE: Complaint = Complaint::across(
    "group",
    "cannot get a lease from etcd; retrying",
    "etcd grants leases again",
);

/// What a node puts in its leader key: who it is and where its API listens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderValue {
    pub node_id: String,
    pub address: String,
}

impl LeaderValue {
    /// Reads a leader key's value; a value that is not ours (written by hand) is
    /// shown as the node id.
    pub fn parse(bytes: &[u8]) -> LeaderValue {
        serde_json::from_slice(bytes).unwrap_or_else(|_| LeaderValue {
            node_id: String::from_utf8_lossy(bytes).into_owned(),
            address: String::new(),
        })
    }
}

/// Why a term ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum TermEnd {
    Shutdown,
    Resigned,
    /// An operator handed leadership to another node (`POST /v1/admin/switchover`).
    Switchover,
    Fenced {
        held: u64,
    },
    MasterMoved,
    LeaseGone,
    KeyDeleted,
    Deadline,
}

impl TermEnd {
    /// For the leadership history (`leadership::Ended::why`).
    fn kind(&self) -> &'static str {
        match self {
            TermEnd::Shutdown => "shut down",
            TermEnd::Resigned => "resigned",
            TermEnd::Switchover => "switchover",
            TermEnd::Fenced { .. } => "fenced",
            TermEnd::MasterMoved => "master moved",
            TermEnd::LeaseGone | TermEnd::KeyDeleted | TermEnd::Deadline => "lease lost",
        }
    }

    fn reason(&self) -> String {
        match self {
            TermEnd::Shutdown => "shutting down".into(),
            TermEnd::Resigned => "resign requested".into(),
            TermEnd::Switchover => "switchover to another node requested".into(),
            TermEnd::Fenced { held } => format!("fenced: epoch {held} holds the fence"),
            TermEnd::MasterMoved => {
                "the Redis master moved: a new term raises the fences there".into()
            }
            TermEnd::LeaseGone => "etcd says the lease expired".into(),
            TermEnd::KeyDeleted => "the leader key was deleted".into(),
            TermEnd::Deadline => "lease deadline passed without a renewal".into(),
        }
    }
}

/// What the loop does after a round.
enum Next {
    Stop,
    Again(Duration),
}

/// Joins the election until `cancel`, publishing this node's role through
/// `elector`. On cancellation a leader resigns and revokes its lease, so that a
/// standby takes over at once.
pub async fn run(
    config: EtcdConfig,
    node_id: String,
    address: String,
    elector: Elector,
    store: Store,
    cancel: CancellationToken,
) {
    elector.info.send_modify(|i| {
        i.mode = "etcd";
        i.etcd_reachable = Some(false);
    });
    metrics::gauge!(m::ETCD_REACHABLE).set(0.0);
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let place = elector.group.map_or(0, u64::from);
    // The channel connects lazily and reconnects by itself, so this fails only on
    // an endpoint it cannot parse.
    let client = loop {
        match connect(&config).await {
            Ok(client) => {
                if let Some(said) = NO_CLIENT.recovered_on(place) {
                    tracing::info!("{said}");
                }
                break client;
            }
            Err(e) => {
                if let Some(said) = NO_CLIENT.failed_on(place) {
                    tracing::error!(error = %explain(&config, &e), endpoints = ?config.endpoints, "{said}");
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    };
    backoff.reset();
    tokio::spawn(observe_leader(
        client.clone(),
        config.clone(),
        elector.info.clone(),
        cancel.child_token(),
    ));

    let (want, wanted) = watch::channel(None);
    let (held_tx, held) = watch::channel(None);
    let presence = store.clone();
    let presence_token = cancel.child_token();
    tokio::spawn(async move {
        presence
            .hold_presence(wanted, held_tx, presence_token)
            .await
    });
    let watcher = takeover::Watcher {
        client: client.clone(),
        config: config.clone(),
        store: store.clone(),
        node_id: node_id.clone(),
        info: elector.info.subscribe(),
        role: elector.role.subscribe(),
        held: held.clone(),
    };
    tokio::spawn(watcher.run(cancel.child_token()));

    let (switch_tx, switchover) = watch::channel(None);
    tokio::spawn(follow_switchover(
        store.clone(),
        switch_tx,
        cancel.child_token(),
    ));
    let me = LeaderValue { node_id, address };
    let mut node = Node {
        switchover,
        store: store.clone(),
        value: serde_json::to_string(&me).expect("two strings serialize"),
        me,
        client,
        config,
        elector,
        cancel,
        backoff,
        want,
        held,
    };
    loop {
        match node.round().await {
            Next::Stop => break,
            Next::Again(pause) => {
                tokio::select! {
                    _ = node.cancel.cancelled() => break,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
    node.elector.end("shut down", "shutting down");
}

struct Node {
    client: Client,
    config: EtcdConfig,
    me: LeaderValue,
    /// `me` as JSON: the leader key's value.
    value: String,
    elector: Elector,
    cancel: CancellationToken,
    /// Between rounds that failed or ended in short terms.
    backoff: Backoff,
    /// The lease whose presence this node holds in Redis (see `takeover`).
    want: watch::Sender<Option<i64>>,
    /// The presence held, as the presence task says.
    held: watch::Receiver<Option<Held>>,
    /// The node a switchover in progress hands leadership to (see
    /// [`follow_switchover`]).
    switchover: watch::Receiver<Option<String>>,
    store: Store,
}

/// How often a node reads whether a switchover is asked for.
const SWITCHOVER_EVERY: Duration = Duration::from_millis(100);

/// Follows the switchover key in Redis (written by `POST /v1/admin/switchover` on
/// any node) until `cancel`. While it names another node, a leader resigns and a
/// standby stays out of the election (it revokes its lease, so its candidacy goes),
/// so that the named node, still campaigning, is next; once that node leads it
/// clears the key and everyone campaigns again. The key expires by itself if the
/// named node never takes over.
async fn follow_switchover(
    store: Store,
    target: watch::Sender<Option<String>>,
    cancel: CancellationToken,
) {
    loop {
        match store.switchover_target().await {
            Ok(now) => {
                target.send_if_modified(|t| std::mem::replace(t, now.clone()) != now);
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the switchover key"),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(SWITCHOVER_EVERY) => {}
        }
    }
}

/// Completes once a switchover names a node other than `me` (`other`), or names
/// none or `me` (`!other`); never if the switchover follower is gone.
async fn switchover_turns(switch: &mut watch::Receiver<Option<String>>, me: &str, other: bool) {
    let turned = switch
        .wait_for(|t| handing_to_other(t, me) == other)
        .await
        .is_ok();
    if !turned {
        std::future::pending::<()>().await;
    }
}

impl Node {}

/// Whether a switchover names a node other than `me`.
fn handing_to_other(target: &Option<String>, me: &str) -> bool {
    target.as_deref().is_some_and(|t| t != me)
}

impl Node {
    /// One lease: grant, campaign, lead, release.
    async fn round(&mut self) -> Next {
        // Out of the election while a switchover hands leadership to another node.
        let me = self.me.node_id.clone();
        let mut switch = self.switchover.clone();
        let aside = handing_to_other(&switch.borrow_and_update(), &me);
        if aside {
            tracing::info!("switchover to another node in progress; standing aside");
            tokio::select! {
                _ = self.cancel.cancelled() => return Next::Stop,
                _ = switchover_turns(&mut switch, &me, false) => {}
            }
        }
        let ttl = ttl_seconds(self.config.lease_ttl);
        let sent = Instant::now();
        let lease_client = self.client.lease_client();
        let granted = tokio::select! {
            _ = self.cancel.cancelled() => return Next::Stop,
            r = call(self.config.connect_timeout, || {
                let mut c = lease_client.clone();
                async move { c.grant(ttl, None).await }
            }) => r,
        };
        let place = self.place();
        let granted = match granted {
            Ok(g) if g.ttl() > 0 => {
                if let Some(said) = NO_LEASE.recovered_on(place) {
                    tracing::info!("{said}");
                }
                g
            }
            Ok(g) => {
                if let Some(said) = NO_LEASE.failed_on(place) {
                    tracing::warn!(error = %format_args!("etcd refused: {}", g.error()), "{said}");
                }
                return Next::Again(self.backoff.next_delay());
            }
            Err(e) => {
                if let Some(said) = NO_LEASE.failed_on(place) {
                    tracing::warn!(error = %explain(&self.config, e.as_ref()), "{said}");
                }
                return Next::Again(self.backoff.next_delay());
            }
        };
        let timing = Timing::new(Duration::from_secs(granted.ttl() as u64));
        let mut lease = Lease::keep_alive(self.client.clone(), granted.id(), timing, sent);
        tracing::debug!(lease = granted.id(), ttl = ?timing.ttl, "lease granted; campaigning");
        if self.announce(granted.id()).await.is_err() {
            self.release(lease, None).await;
            return Next::Stop;
        }

        let key = match self.campaign(&mut lease).await {
            Ok(key) => key,
            Err(next) => {
                self.release(lease, None).await;
                return next;
            }
        };

        // etcd 3.4 can end a campaign whose key expired while it waited: lead only
        // once the key is seen to exist, and watch it from that read on.
        let mut watch = KeyWatch::new(
            self.client.clone(),
            key.key().to_vec(),
            key.rev(),
            self.config.connect_timeout,
        );
        tracing::debug!(rev = key.rev(), "campaign won; reading the leader key");
        let checked = tokio::select! {
            _ = self.cancel.cancelled() => {
                self.release(lease, Some(key)).await;
                return Next::Stop;
            }
            r = watch.open_won() => r,
        };
        match checked {
            Ok(KeyCheck::Present) => {}
            Ok(KeyCheck::Gone) => {
                tracing::info!(
                    "won the election, but the leader key was gone by then; campaigning again"
                );
                self.release(lease, Some(key)).await;
                return Next::Again(self.backoff.next_delay());
            }
            Err(e) => {
                tracing::warn!(
                    error = %explain(&self.config, e.as_ref()),
                    "won the election, but cannot watch the leader key; campaigning again"
                );
                self.release(lease, Some(key)).await;
                return Next::Again(self.backoff.next_delay());
            }
        }

        let started = Instant::now();
        let end = self.lead(&mut lease, key.rev() as u64, &mut watch).await;
        drop(watch);
        if started.elapsed() > timing.ttl {
            self.backoff.reset();
        }
        self.release(lease, Some(key)).await;
        match end {
            TermEnd::Shutdown => Next::Stop,
            TermEnd::Resigned => Next::Again(RESIGN_PAUSE),
            TermEnd::Switchover => Next::Again(Duration::ZERO),
            TermEnd::MasterMoved => Next::Again(Duration::ZERO),
            // A node fenced again right after each win (an etcd cluster rebuilt
            // under an old fence) backs off further each time.
            _ => Next::Again(self.backoff.next_delay()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// etcd's errors when it is not there, as the log says them: one line, each
    /// error of the chain by `Display` (tonic's shows its source as a `Debug`
    /// struct, `ConnectError(…, Os { code: 111, … })`).
    #[tokio::test]
    async fn etcd_errors_read_as_one_line_without_debug_structs() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let options = ConnectOptions::new().with_connect_timeout(Duration::from_millis(500));
        let failed = match Client::connect([format!("127.0.0.1:{port}")], Some(options)).await {
            Err(e) => e,
            Ok(client) => client.kv_client().get("k", None).await.unwrap_err(),
        };
        let text = readable(&failed);
        assert!(
            !text.contains('{') && !text.contains('\n') && !text.contains("Os "),
            "{text}\n{failed:?}"
        );
        assert!(text.to_lowercase().contains("connection refused"), "{text}");
        let wrapped = anyhow::Error::from(failed);
        assert_eq!(readable(wrapped.as_ref()), text, "through anyhow");
    }

    #[track_caller]
    fn check_value(bytes: &[u8], node_id: &str, address: &str) {
        let v = LeaderValue::parse(bytes);
        assert_eq!((v.node_id.as_str(), v.address.as_str()), (node_id, address));
    }

    #[test]
    fn leader_values_read_back() {
        check_value(
            br#"{"node_id":"a","address":"10.0.0.1:7070"}"#,
            "a",
            "10.0.0.1:7070",
        );
        check_value(b"written by hand", "written by hand", "");
        let me = LeaderValue {
            node_id: "n1".into(),
            address: "127.0.0.1:1".into(),
        };
        assert_eq!(
            LeaderValue::parse(serde_json::to_string(&me).unwrap().as_bytes()),
            me
        );
    }

    #[test]
    fn term_ends_name_their_cause() {
        assert_eq!(
            TermEnd::Fenced { held: 42 }.reason(),
            "fenced: epoch 42 holds the fence"
        );
        assert_eq!(
            TermEnd::Deadline.reason(),
            "lease deadline passed without a renewal"
        );
    }
}
