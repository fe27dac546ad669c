//! Leadership as a value: who leads, under which epoch.
//!
//! An elector (standalone here, etcd in `election`) publishes the current [`Role`]
//! through a watch channel; leader-only loops start when it says `Leader` and are
//! cancelled when it says anything else. Loops that learn they were deposed (a
//! `FENCED` reply) ask the elector to step down through the same handle.

use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// One term of leadership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    /// Strictly increasing across leaders: the fence every leader-only script checks.
    pub epoch: u64,
    pub since: SystemTime,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Not leading: serving the API only.
    Follower,
    Leader(Term),
}

impl Role {
    pub fn epoch(&self) -> Option<u64> {
        match self {
            Role::Leader(term) => Some(term.epoch),
            Role::Follower => None,
        }
    }

    pub fn is_leader(&self) -> bool {
        matches!(self, Role::Leader(_))
    }
}

/// Why a leader gives up its term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepDown {
    /// A newer leader raised the fence above this one's epoch.
    Fenced { epoch: u64, held: u64 },
    /// An operator asked for a planned switchover.
    Resign,
    /// The Redis master moved (a Sentinel failover): the fences there may have gone
    /// back with the writes the failover lost, so a new term raises them.
    MasterMoved { epoch: u64 },
}

/// What every part of the daemon sees of leadership.
#[derive(Clone, Debug)]
pub struct Leadership {
    role: watch::Receiver<Role>,
    requests: mpsc::UnboundedSender<StepDown>,
    /// Details the elector publishes for `/v1/leader` (who leads, lease left).
    info: watch::Receiver<LeaderInfo>,
}

/// What this node knows of the current leader, for operators.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderInfo {
    pub node_id: Option<String>,
    pub address: Option<String>,
    pub epoch: Option<u64>,
    /// The leader's etcd lease (etcd mode): a standby that sees the leader gone
    /// from Redis ends it (see `election::takeover`).
    pub lease: Option<i64>,
    /// When this node's lease runs out by its own clock, while it leads (etcd mode):
    /// the local deadline of the last renewal, or a past instant once it is beyond it
    /// (failsafe). See [`LeaderInfo::lease_left`].
    pub lease_deadline: Option<Instant>,
    pub mode: &'static str,
    /// Whether etcd answered the last query (None without etcd), for `/readyz`.
    pub etcd_reachable: Option<bool>,
}

impl LeaderInfo {
    /// Lease time left now (zero beyond the deadline), while this node leads.
    pub fn lease_left(&self) -> Option<Duration> {
        self.lease_deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }
}

/// The elector's side of a [`Leadership`].
pub struct Elector {
    pub role: watch::Sender<Role>,
    pub requests: mpsc::UnboundedReceiver<StepDown>,
    pub info: watch::Sender<LeaderInfo>,
}

/// A connected pair: the elector publishes, everyone else reads.
pub fn channel() -> (Elector, Leadership) {
    let (role_tx, role_rx) = watch::channel(Role::Follower);
    let (req_tx, req_rx) = mpsc::unbounded_channel();
    let (info_tx, info_rx) = watch::channel(LeaderInfo::default());
    (
        Elector {
            role: role_tx,
            requests: req_rx,
            info: info_tx,
        },
        Leadership {
            role: role_rx,
            requests: req_tx,
            info: info_rx,
        },
    )
}

impl Leadership {
    pub fn current(&self) -> Role {
        self.role.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    pub fn info(&self) -> LeaderInfo {
        self.info.borrow().clone()
    }

    /// Follows what the elector publishes for operators (leader, epoch, mode).
    pub fn info_updates(&self) -> watch::Receiver<LeaderInfo> {
        self.info.clone()
    }

    /// Asks the elector to end the current term. Ignored if the term already ended.
    pub fn step_down(&self, why: StepDown) {
        let _ = self.requests.send(why);
    }
}

impl Elector {
    /// Publishes a role change, and records it in logs and metrics.
    pub fn set(&self, role: Role, reason: &str) {
        let old = self.role.borrow().clone();
        if old == role {
            return;
        }
        match &role {
            Role::Leader(term) => {
                tracing::info!(epoch = term.epoch, reason, "leadership gained");
                metrics::gauge!(crate::metrics::EPOCH).set(term.epoch as f64);
            }
            Role::Follower => tracing::warn!(epoch = old.epoch(), reason, "leadership lost"),
        }
        metrics::gauge!(crate::metrics::IS_LEADER).set(if role.is_leader() { 1.0 } else { 0.0 });
        metrics::counter!(crate::metrics::TRANSITIONS).increment(1);
        self.role.send_replace(role);
    }
}

/// Leads without etcd: takes an epoch from Redis and leads until fenced out by a
/// newer standalone instance (then it serves the API only) or until `cancel`.
pub async fn run_standalone(
    store: Store,
    node_id: String,
    address: String,
    mut elector: Elector,
    cancel: CancellationToken,
) {
    let mut backoff =
        crate::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut above = 0;
    'terms: loop {
        let epoch = loop {
            match store.next_standalone_epoch(above).await {
                Ok(epoch) => break epoch,
                Err(e) => {
                    tracing::warn!(error = %e, "standalone: cannot take an epoch from Redis; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => break 'terms,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        };
        backoff.reset();
        // The role first: whoever sees the standalone details (the service manager's
        // READY, `/v1/leader`) then also sees this node leading.
        elector.set(
            Role::Leader(Term {
                epoch,
                since: SystemTime::now(),
            }),
            "standalone: no etcd configured",
        );
        elector.info.send_replace(LeaderInfo {
            node_id: Some(node_id.clone()),
            address: Some(address.clone()),
            epoch: Some(epoch),
            lease: None,
            lease_deadline: None,
            mode: "standalone",
            etcd_reachable: None,
        });
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break 'terms,
                request = elector.requests.recv() => match request {
                    Some(StepDown::Fenced { epoch, held }) => {
                        tracing::error!(epoch, held, "standalone: fenced out by a newer instance; serving the API only from now on");
                        metrics::counter!(crate::metrics::FENCED).increment(1);
                        elector.info.send_modify(|i| { i.node_id = None; i.address = None; i.epoch = Some(held); });
                        elector.set(Role::Follower, "fenced");
                    }
                    Some(StepDown::MasterMoved { epoch: moved }) if moved == epoch => {
                        // A new epoch, above this one, from the new master.
                        elector.set(Role::Follower, "the Redis master moved");
                        above = epoch;
                        continue 'terms;
                    }
                    Some(StepDown::MasterMoved { .. }) => {}
                    Some(StepDown::Resign) => {
                        tracing::warn!("standalone: resign requested, but with no etcd there is no one to hand over to; still leading");
                    }
                    None => break 'terms,
                }
            }
        }
    }
    elector.set(Role::Follower, "shutting down");
}
