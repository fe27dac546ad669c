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
//! Layout: this file is the round loop (`run`, `Node`: grant, campaign, lead,
//! release); `lease.rs` the lease's timings, local deadline, failsafe rule and
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
mod client;
mod key;
mod lease;
mod observe;
mod takeover;

pub use balance::{balance, group_config};
use client::*;
use key::*;
use lease::*;
use observe::observe_leader;
pub use observe::{ElectionView, candidates, view};
pub use takeover::SILENT;

/// How long a node that resigned stays out of the race, so that another takes
/// over (those already campaigning win within milliseconds).
const RESIGN_PAUSE: Duration = Duration::from_secs(1);
/// How often a standby whose campaign has not returned asks etcd who leads. When
/// the answer is its own key twice running, the campaign is stuck and is sent
/// again, which returns at once (the key is already first in line). Seen after etcd
/// members restart: the member serving a campaign can leave it waiting until etcd's
/// request timeout, seconds after the leader before it resigned.
const STUCK_CAMPAIGN_CHECK: Duration = Duration::from_millis(100);
/// How long a node waits for its presence in Redis (see `takeover`) before it
/// campaigns anyway, if no other node campaigns: a node that cannot reach Redis
/// may still lead while no standby can reach Redis either.
const PRESENCE_WAIT: Duration = Duration::from_secs(1);
/// How often a node whose Redis does not answer, standing aside, looks again
/// whether another node still campaigns.
const ASIDE_CHECK: Duration = Duration::from_secs(1);
/// Bound on each of resign and revoke when a term ends, so shutdown stays fast
/// even when etcd is gone.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

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
static CAMPAIGN_FAILED: Complaint =
    Complaint::across("group", "campaign failed", "campaigning works again");

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

/// Longest a leader waits for the other standbys to leave the election before it
/// hands over to a switchover's node.
const STAND_ASIDE_WAIT: Duration = Duration::from_secs(2);

impl Node {
    /// Waits until every candidate but this node and `to` has left the election
    /// (each standby does once it reads the switchover key), at most
    /// [`STAND_ASIDE_WAIT`]: `to`, the one candidate left, then leads next.
    async fn others_stood_aside(&self, to: &str) {
        let prefix = format!("{}/", self.config.election_prefix);
        let deadline = Instant::now() + STAND_ASIDE_WAIT;
        loop {
            let read = observe::campaigners(&self.client, &self.config, &prefix, None).await;
            let only_us = read.is_ok_and(|r| {
                r.kvs().iter().all(|kv| {
                    let node = LeaderValue::parse(kv.value()).node_id;
                    node == self.me.node_id || node == to
                })
            });
            if only_us || Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(SWITCHOVER_EVERY / 2).await;
        }
    }
}

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

    /// Holds this node's presence for `lease` in Redis before it campaigns with it,
    /// so that no standby ever finds a leader without one; waits at most
    /// [`PRESENCE_WAIT`]. Err when cancelled.
    async fn announce(&mut self, lease: i64) -> Result<(), ()> {
        self.want.send_replace(Some(lease));
        if self.presence_within(lease, PRESENCE_WAIT).await? {
            return Ok(());
        }
        // Redis does not serve this node: it stays out of the race while another
        // node campaigns (one that reaches Redis, or that gave up waiting first),
        // so it never wins a group it cannot serve; alone, it campaigns anyway.
        let mut said = false;
        loop {
            let others = self.other_campaigners().await;
            if others == 0 {
                tracing::warn!(
                    "no presence in Redis yet (Redis does not answer); no other node campaigns, so campaigning anyway, and a standby that reaches Redis may end this lease"
                );
                return Ok(());
            }
            if !said {
                tracing::warn!(
                    others,
                    "no presence in Redis (Redis does not answer this node); standing aside while other nodes campaign"
                );
                said = true;
            }
            if self.presence_within(lease, ASIDE_CHECK).await? {
                tracing::info!("presence in Redis held: campaigning");
                return Ok(());
            }
        }
    }

    /// Whether this node's presence for `lease` is held within `wait`; Err when
    /// cancelled.
    async fn presence_within(&mut self, lease: i64, wait: Duration) -> Result<bool, ()> {
        tokio::select! {
            _ = self.cancel.cancelled() => Err(()),
            r = tokio::time::timeout(
                wait,
                self.held.wait_for(|h| h.is_some_and(|h| h.lease == lease)),
            ) => Ok(r.is_ok_and(|r| r.is_ok())),
        }
    }

    /// How many other nodes campaign in this election now (an unreadable etcd
    /// counts as none: the campaign then fails or waits on its own).
    async fn other_campaigners(&self) -> usize {
        let prefix = format!("{}/", self.config.election_prefix);
        match observe::campaigners(&self.client, &self.config, &prefix, None).await {
            Ok(read) => read
                .kvs()
                .iter()
                .filter(|kv| LeaderValue::parse(kv.value()).node_id != self.me.node_id)
                .count(),
            Err(_) => 0,
        }
    }

    /// Where this node's election failures count (`Complaint::failed_on`): its
    /// election group.
    fn place(&self) -> u64 {
        self.elector.group.map_or(0, u64::from)
    }

    /// Campaigns until this node leads; the lease stays alive meanwhile.
    async fn campaign(&mut self, lease: &mut Lease) -> Result<LeaderKey, Next> {
        let mut retry = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        let me = self.me.node_id.clone();
        let mut switch = self.switchover.clone();
        loop {
            let mut election = self.client.election_client();
            let attempt = election.campaign(
                self.config.election_prefix.clone(),
                self.value.clone(),
                lease.id,
            );
            tokio::pin!(attempt);
            let sent = Instant::now();
            let mut check = tokio::time::interval(STUCK_CAMPAIGN_CHECK);
            check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut named_leader = 0;
            let failure = loop {
                tokio::select! {
                    _ = self.cancel.cancelled() => return Err(Next::Stop),
                    state = lease.changed() => if state.contact == Contact::Gone {
                        tracing::info!("lease expired while standing by; campaigning again with a new one");
                        return Err(Next::Again(Duration::ZERO));
                    },
                    Some(request) = self.elector.requests.recv() => {
                        tracing::debug!(?request, "not leading; step-down request ignored");
                    }
                    _ = switchover_turns(&mut switch, &me, true) => {
                        return Err(Next::Again(Duration::ZERO));
                    }
                    result = &mut attempt => match result {
                        Ok(mut resp) => match resp.take_leader() {
                            Some(key) => {
                                if let Some(said) = CAMPAIGN_FAILED.recovered_on(self.place()) {
                                    tracing::info!("{said}");
                                }
                                return Ok(key);
                            }
                            None => break Some(anyhow!("etcd answered the campaign without a leader key")),
                        },
                        Err(e) => break Some(anyhow::Error::from(e)),
                    },
                    _ = check.tick() => {
                        // A campaign that stands waits for the leader before it: etcd took it.
                        if sent.elapsed() > Duration::from_secs(1)
                            && let Some(said) = CAMPAIGN_FAILED.recovered_on(self.place())
                        {
                            tracing::info!("{said}");
                        }
                        if self.etcd_names_leader(lease.id).await {
                            named_leader += 1;
                        } else {
                            named_leader = 0;
                        }
                        if named_leader >= 2 {
                            break None;
                        }
                    }
                }
            };
            let Some(failure) = failure else {
                tracing::info!(
                    "etcd names this node leader but its campaign has not returned; campaigning again at once"
                );
                continue;
            };
            // A campaign that stood a while before failing (its etcd member went away,
            // or etcd timed it out when the leader resigned) is no failure streak: the
            // next one goes out after the first, short delay, not a grown one.
            if sent.elapsed() > Duration::from_secs(1) {
                retry.reset();
            }
            let delay = retry.next_delay();
            if let Some(said) = CAMPAIGN_FAILED.failed_on(self.place()) {
                tracing::warn!(error = %explain(&self.config, failure.as_ref()), retry_in = ?delay, "{said}");
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return Err(Next::Stop),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Whether etcd's current leader key is this node's (made with `lease_id`);
    /// false when etcd does not answer soon.
    async fn etcd_names_leader(&self, lease_id: i64) -> bool {
        let mut election = self.client.election_client();
        let asked = tokio::time::timeout(
            STUCK_CAMPAIGN_CHECK * 5,
            election.leader(self.config.election_prefix.clone()),
        )
        .await;
        matches!(asked, Ok(Ok(resp)) if resp.kv().is_some_and(|kv| kv.lease() == lease_id))
    }

    /// Leads until the term ends, and says why it ended. The role is `Follower`
    /// again when this returns.
    async fn lead(&mut self, lease: &mut Lease, epoch: u64, watch: &mut KeyWatch) -> TermEnd {
        let failsafe = self.config.failsafe;
        let state = lease.state();
        if state.contact == Contact::Gone {
            return TermEnd::LeaseGone;
        }
        if Instant::now() >= state.deadline
            && at_deadline(state.contact, failsafe) == AtDeadline::StepDown
        {
            return TermEnd::Deadline;
        }
        self.elector.set(
            Role::Leader(Term {
                epoch,
                since: SystemTime::now(),
            }),
            "won the etcd election",
        );
        self.publish_lease(state.deadline, epoch, lease.id);
        let me = self.me.node_id.clone();
        let mut switch = self.switchover.clone();
        // Asked of Redis, not of the follower's last read: a leader with no other
        // standby to wait for resigns at once, and this node may win before its
        // follower has read the key. Left in place, the key would keep the other
        // standbys out of the election until it expires.
        // In the background: a Redis that does not answer (a cluster connection
        // learning a new topology) must not keep this term from watching its
        // lease and key, or a node that lost the group would go on claiming it.
        let (store, node, within) = (self.store.clone(), me.clone(), self.config.connect_timeout);
        tokio::spawn(async move {
            match tokio::time::timeout(within, store.clear_switchover(&node)).await {
                Ok(Ok(true)) => tracing::info!(epoch, "switchover done: this node leads"),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot clear the switchover key; it expires by itself")
                }
                Err(_) => tracing::warn!(
                    "cannot clear the switchover key (Redis did not answer in time); it expires by itself"
                ),
            }
        });

        // Past the deadline under failsafe: the deadline timer is off until a
        // renewal moves the deadline again.
        let mut beyond_deadline = false;
        let mut told_unreachable = false;
        let end = loop {
            let deadline = lease.state().deadline;
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break TermEnd::Shutdown,
                Some(request) = self.elector.requests.recv() => match request {
                    StepDown::Fenced { epoch: caller, held } if caller == epoch => break TermEnd::Fenced { held },
                    StepDown::Resign => break TermEnd::Resigned,
                    StepDown::MasterMoved { epoch: caller } if caller == epoch => break TermEnd::MasterMoved,
                    other => tracing::debug!(?other, "step-down request from an earlier term ignored"),
                },
                state = lease.changed() => match state.contact {
                    Contact::Gone => break TermEnd::LeaseGone,
                    Contact::Renewed => {
                        if beyond_deadline {
                            tracing::info!(epoch, "etcd answers again and the lease holds; leading under its deadline again");
                        }
                        beyond_deadline = false;
                        told_unreachable = false;
                        self.publish_lease(state.deadline, epoch, lease.id);
                    }
                    Contact::Unreachable => if !told_unreachable {
                        told_unreachable = true;
                        tracing::warn!(epoch, failsafe, left = ?state.deadline.saturating_duration_since(Instant::now()),
                            "etcd does not answer lease renewals; leading until the lease deadline{}",
                            if failsafe { ", and beyond it while etcd stays unreachable (failsafe)" } else { "" });
                    },
                },
                _ = tokio::time::sleep_until(deadline), if !beyond_deadline => {
                    match at_deadline(lease.state().contact, failsafe) {
                        AtDeadline::StepDown => break TermEnd::Deadline,
                        AtDeadline::KeepLeading => {
                            beyond_deadline = true;
                            tracing::warn!(epoch, "lease deadline passed while etcd is unreachable; failsafe: still forwarding under the fence");
                            self.publish_lease(deadline, epoch, lease.id);
                        }
                    }
                }
                () = watch.deleted() => break TermEnd::KeyDeleted,
                _ = switchover_turns(&mut switch, &me, true) => {
                    let to = switch.borrow().clone().unwrap_or_default();
                    self.others_stood_aside(&to).await;
                    break TermEnd::Switchover;
                }
            }
        };
        self.elector.end(end.kind(), &end.reason());
        let me = self.me.node_id.clone();
        self.elector.info.send_modify(|i| {
            i.lease_deadline = None;
            if i.node_id.as_deref() == Some(me.as_str()) {
                i.node_id = None;
                i.address = None;
                i.epoch = None;
                i.lease = None;
            }
        });
        metrics::gauge!(m::LEASE_REMAINING).set(0.0);
        if let TermEnd::Fenced { held } = end {
            // The term said it, once for every group fenced with it (`Term::fenced`).
            metrics::counter!(m::FENCED).increment(1);
            tracing::debug!(epoch, held, "fenced out: the term is over");
        }
        end
    }

    /// Shows the lease time left on `/v1/leader` and in metrics (zero once the
    /// deadline has passed, under failsafe).
    fn publish_lease(&self, deadline: Instant, epoch: u64, lease: i64) {
        let left = deadline.saturating_duration_since(Instant::now());
        metrics::gauge!(m::LEASE_REMAINING).set(left.as_secs_f64());
        let me = self.me.clone();
        self.elector.info.send_modify(|i| {
            i.node_id = Some(me.node_id);
            i.address = Some(me.address);
            i.epoch = Some(epoch);
            i.lease = Some(lease);
            i.lease_deadline = Some(deadline);
        });
    }

    /// Resigns (a standby takes over within milliseconds) and revokes the lease,
    /// each bounded so that shutdown stays fast when etcd is gone.
    async fn release(&self, lease: Lease, key: Option<LeaderKey>) {
        let gone = lease.state().contact == Contact::Gone;
        let id = lease.id;
        drop(lease);
        if gone {
            return;
        }
        if let Some(key) = key {
            let asked = Instant::now();
            let election = self.client.election_client();
            let resigned = call(RELEASE_TIMEOUT, || {
                let mut c = election.clone();
                let key = key.clone();
                async move { c.resign(Some(ResignOptions::new().with_leader(key))).await }
            })
            .await;
            match resigned {
                Ok(_) => {
                    tracing::debug!(took = ?asked.elapsed(), "resigned: the leader key is deleted")
                }
                Err(e) => tracing::warn!(
                    error = %explain(&self.config, e.as_ref()),
                    "cannot resign; the lease will expire instead"
                ),
            }
        }
        let lease_client = self.client.lease_client();
        let revoked = call(RELEASE_TIMEOUT, || {
            let mut c = lease_client.clone();
            async move { c.revoke(id).await }
        })
        .await;
        if let Err(e) = revoked {
            tracing::debug!(
                error = %readable(e.as_ref()),
                "cannot revoke the lease; it will expire"
            );
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
