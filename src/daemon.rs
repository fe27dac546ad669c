//! The daemon's lifecycle: [`start`] brings it up, [`Daemon::stop`] takes it down in
//! order, [`run`] does both around a shutdown signal.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::leadership::Leadership;
use crate::store::Store;
use crate::{api, election, health, inbox, leader, leadership, metrics};

/// A running daemon.
pub struct Daemon {
    pub api_addr: SocketAddr,
    pub leadership: Leadership,
    pub store: Store,
    /// What this node's Redis probe found (see [`health`]).
    pub health: health::Health,
    /// The running configuration; a reload publishes a new one (see [`reload`]).
    live: tokio::sync::watch::Sender<Arc<Config>>,
    work: CancellationToken,
    work_task: JoinHandle<()>,
    inbox_task: JoinHandle<()>,
    election: CancellationToken,
    election_task: JoinHandle<()>,
    api: CancellationToken,
    api_task: JoinHandle<std::io::Result<()>>,
    probe: CancellationToken,
    probe_task: JoinHandle<()>,
    registry: CancellationToken,
    registry_task: JoinHandle<()>,
    /// Where reloads asked over HTTP go, once someone rereads the configuration
    /// file ([`Daemon::take_reload_requests`]).
    reloads: tokio::sync::watch::Sender<Option<tokio::sync::mpsc::Sender<api::ReloadRequest>>>,
    /// The API's certificate (`api.tls`), read again at each reload.
    tls: Option<Arc<api::tls::ServerTls>>,
}

/// How long a start waits for Redis while it does not answer (a Redis still
/// starting, a machine too busy to answer one connection in time); one that stays
/// away longer fails the start, and the service manager starts the node again.
const REDIS_AT_START: Duration = Duration::from_secs(30);

/// The store, once Redis answers: transient failures are tried again, with a
/// backoff, for [`REDIS_AT_START`]; any other (a password refused, a Redis Cluster
/// where a single Redis is configured) fails at once.
async fn connect_store(config: &Config) -> anyhow::Result<Store> {
    let give_up = std::time::Instant::now() + REDIS_AT_START;
    let mut backoff =
        crate::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        match Store::connect(&config.store_config()).await {
            Ok(store) => return Ok(store),
            Err(e) if e.is_transient() && std::time::Instant::now() < give_up => {
                tracing::warn!(error = %e, redis = %config.redis_target(), "Redis does not answer yet; trying again");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("connect to {}", config.redis_target()));
            }
        }
    }
}

/// Connects to Redis, binds the API, joins the election and starts the leader-only
/// loops (which run only while this node leads).
pub async fn start(config: Config) -> anyhow::Result<Daemon> {
    let config = Arc::new(config);
    let (live, live_config) = tokio::sync::watch::channel(config.clone());
    let metrics = metrics::install();
    // Every series known from the configuration, at 0 before the first event.
    metrics::set_max_streams(config.metrics.max_streams);
    metrics::register_known(&config);
    ::metrics::gauge!(metrics::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    let store = connect_store(&config).await?;
    let journal = match &config.journal {
        Some(settings) => Some(open_journal(settings, &store).await?),
        None => None,
    };
    // Pushes to a rate-limited stream are kept apart, as the running configuration
    // says (a reload changes the streams).
    store.keep_apart(config.kept_apart());
    tokio::spawn(follow_kept_apart(store.clone(), live_config.clone()));
    let ingest = crate::ingest::Ingest::new(
        store.clone(),
        journal.clone().map(crate::journal::Committer::start),
    );
    let listener = tokio::net::TcpListener::bind(config.api.listen)
        .await
        .with_context(|| format!("bind the API to {} (api.listen)", config.api.listen))?;
    let api_addr = listener.local_addr()?;
    // What other nodes, the dashboard and the CLI are told to reach this node at.
    let advertised = config
        .api
        .advertise
        .clone()
        .unwrap_or_else(|| api_addr.to_string());
    let tls = config
        .api
        .tls
        .as_ref()
        .map(api::tls::ServerTls::load)
        .transpose()
        .context("api.tls")?;
    let listener = match &tls {
        Some(tls) => api::listener::Listener::tls(listener, tls.acceptor()?)?,
        None => api::listener::Listener::Plain(listener),
    };
    if tls.is_none() && !config.api.listen.ip().is_loopback() {
        tracing::warn!(api = %api_addr, "the API listens beyond loopback over plain HTTP: tokens cross the network in clear (set api.tls)");
    }
    let probe = CancellationToken::new();
    let (health, probe_task) = health::start(
        store.clone(),
        config.node_id.clone(),
        config.redis.timeout,
        config.checked_streams(),
        probe.clone(),
    )
    .await;

    let election = CancellationToken::new();
    let work = CancellationToken::new();
    let (leadership, groups, election_task, work_task) =
        match (&config.etcd, config.election.per_shard) {
            (Some(etcd), true) => start_groups(
                &config,
                etcd,
                (&store, journal.as_ref()),
                &advertised,
                live_config.clone(),
                &election,
                &work,
            ),
            (etcd, _) => {
                let (elector, leadership) = leadership::channel();
                let election_task = match etcd {
                    None => tokio::spawn(leadership::run_standalone(
                        store.clone(),
                        config.node_id.clone(),
                        advertised.clone(),
                        elector,
                        election.clone(),
                    )),
                    Some(etcd) => tokio::spawn(election::run(
                        etcd.clone(),
                        config.node_id.clone(),
                        advertised.clone(),
                        elector,
                        store.clone(),
                        election.clone(),
                    )),
                };
                let work_task = tokio::spawn(leader::run_while_leading(
                    live_config.clone(),
                    store.clone(),
                    journal.clone(),
                    leadership.clone(),
                    work.clone(),
                ));
                (leadership, Vec::new(), election_task, work_task)
            }
        };

    // Every instance, leader or standby, schedules from the inbox.
    let inbox_task = tokio::spawn(inbox::run(
        live_config.clone(),
        ingest.clone(),
        work.clone(),
    ));

    // Every instance reconciles the schedules its file declares, at start and at
    // each reload.
    tokio::spawn(crate::schedules::declared::run(
        live_config.clone(),
        store.clone(),
        journal.clone(),
        work.clone(),
    ));

    let upkeep = metrics.clone();
    let upkeep_token = work.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = upkeep_token.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(5)) => metrics::upkeep(&upkeep),
            }
        }
    });

    let registry = CancellationToken::new();
    let registry_task = tokio::spawn(crate::registry::run(
        store.clone(),
        crate::registry::Identity {
            node_id: config.node_id.clone(),
            address: advertised.clone(),
            started_at_ms: crate::registry::epoch_ms(std::time::SystemTime::now()),
        },
        leadership.clone(),
        match groups.is_empty() {
            true => vec![(None, leadership.clone())],
            false => groups
                .iter()
                .map(|g| (Some(g.group), g.leadership.clone()))
                .collect(),
        },
        registry.clone(),
    ));

    let (reloads, taken_reloads) = tokio::sync::watch::channel(None);
    let api = CancellationToken::new();
    let state = api::AppState::new(api::App {
        config: config.clone(),
        live_config,
        store: store.clone(),
        ingest,
        leadership: leadership.clone(),
        groups: groups.into(),
        health: health.clone(),
        metrics,
        board: Default::default(),
        meters: Default::default(),
        reloads: taken_reloads,
    });
    let api_task = tokio::spawn(api::serve(listener, state, api.clone()));
    tracing::info!(node = %config.node_id, api = %api_addr, redis = %config.redis.describe(), shards = config.redis.shards, "delayq started");

    Ok(Daemon {
        api_addr,
        leadership,
        store,
        health,
        live,
        work,
        work_task,
        inbox_task,
        election,
        election_task,
        api,
        api_task,
        probe,
        probe_task,
        registry,
        registry_task,
        reloads,
        tls,
    })
}

/// `election.mode = "per_shard"`: one election and one leader's term per group of
/// shards, each term working on its group's shards only, the balancer that spreads
/// the groups over the nodes, and the node's leadership merged from the groups'.
/// Returns the merged leadership, the groups, and the tasks that end once every
/// election (after `election`) and every term (after `work`) has stopped.
fn start_groups(
    config: &Config,
    etcd: &crate::config::EtcdConfig,
    (store, journal): (&Store, Option<&crate::journal::Journal>),
    advertised: &str,
    live: tokio::sync::watch::Receiver<Arc<Config>>,
    election: &CancellationToken,
    work: &CancellationToken,
) -> (
    Leadership,
    Vec<leadership::Group>,
    JoinHandle<()>,
    JoinHandle<()>,
) {
    let mut elections = tokio::task::JoinSet::new();
    let mut terms = tokio::task::JoinSet::new();
    let mut groups = Vec::new();
    for group in 0..config.election.groups {
        let shards = config.election.shards_of(group, config.redis.shards);
        let (elector, leadership) = leadership::channel_for(Some(group));
        let etcd = election::group_config(etcd, group);
        let owned = store.owning(shards.clone());
        elections.spawn(election::run(
            etcd,
            config.node_id.clone(),
            advertised.to_owned(),
            elector,
            owned.clone(),
            election.clone(),
        ));
        terms.spawn(leader::run_while_leading(
            live.clone(),
            owned,
            journal.cloned(),
            leadership.clone(),
            work.clone(),
        ));
        groups.push(leadership::Group {
            group,
            shards,
            leadership,
        });
    }
    elections.spawn(election::balance(
        etcd.clone(),
        config.node_id.clone(),
        groups.clone(),
        election.clone(),
    ));
    let (merged, merging) =
        leadership::merge(config.node_id.clone(), advertised.to_owned(), &groups);
    tokio::spawn(merging);
    (
        merged,
        groups,
        tokio::spawn(async move {
            elections.join_all().await;
        }),
        tokio::spawn(async move {
            terms.join_all().await;
        }),
    )
}

/// The journal, its schema migrated if it is behind (and the MySQL user may), and
/// its marker in Redis if Redis has none while the journal has nothing to restore
/// (a first start: the keeper would otherwise take the pushes of the first moments
/// for data Redis lost).
async fn open_journal(
    settings: &crate::config::JournalConfig,
    store: &Store,
) -> anyhow::Result<crate::journal::Journal> {
    let journal = crate::journal::Journal::new(settings)?.with_unique_ids(!store.is_cluster());
    let version = journal
        .version()
        .await
        .with_context(|| format!("reach the journal at {} (journal.url)", settings.url))?;
    if version < crate::journal::SCHEMA_VERSION {
        let migrated = journal.migrate().await.with_context(|| {
            format!("migrate the journal's schema from version {version} (or run delayq journal migrate as a user that may)")
        })?;
        tracing::info!(
            from = migrated.from,
            to = migrated.to,
            "journal schema migrated"
        );
    }
    if store.journal_marker().await?.is_none() {
        let token = journal.marker().await?;
        // Unfinished messages, or a loss meanwhile: the keeper finds it and restores.
        let _ = crate::leader::keeper::mark_if_nothing_to_restore(store, &journal, &token).await;
    }
    Ok(journal)
}

impl Daemon {
    /// Publishes the running configuration; [`Reloader`](crate::reload::Reloader) sends on it.
    pub fn live_config(&self) -> tokio::sync::watch::Sender<Arc<Config>> {
        self.live.clone()
    }

    /// Stops in a fixed order: leader loops first (each finishes the batch in
    /// flight), then the election (resigning, so a standby takes over at once), then
    /// the inbox reader (it finishes its blocking read, up to 500 ms, and the batches
    /// in flight: standbys read the inbox too, so the handover need not wait for it),
    /// then the API (draining requests in flight, for at most 5 s).
    /// Reloads asked over HTTP (`POST /v1/admin/reload`): the caller rereads the
    /// configuration and answers each. Until one calls this, every such request is
    /// refused (409); a second call gets a channel nothing is sent to.
    /// Reads the API's certificate and key again (`api.tls`; nothing without it):
    /// new connections get them. On an error the one served stays.
    pub fn reload_tls(&self) -> Result<(), String> {
        let Some(tls) = &self.tls else {
            return Ok(());
        };
        match tls.reload() {
            Ok(()) => {
                tracing::info!("the API's certificate (api.tls) read again");
                Ok(())
            }
            Err(e) => {
                let problem = format!("api.tls: {e:#}; the certificate served before stays");
                tracing::error!("{problem}");
                Err(problem)
            }
        }
    }

    /// Records in the audit trail each scope whose tokens a reload changed (who:
    /// what asked for the reload; the tokens by name or fingerprint), and logs it.
    pub async fn audit_token_changes(&self, who: &str, outcome: &crate::reload::Outcome) {
        let config = self.live.borrow().clone();
        for change in outcome
            .applied
            .iter()
            .filter(|c| crate::reload::TOKEN_KEYS.contains(&c.key.as_str()))
        {
            let what = "tokens changed".to_owned();
            let target = change.to_string();
            tracing::info!(target: "delayq::audit", %who, from = "this node", %what, %target, status = 200, "audit");
            let at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let fields = [
                ("at", at.to_string()),
                ("node", config.node_id.clone()),
                ("who", who.to_owned()),
                ("from", "this node".to_owned()),
                ("what", what),
                ("target", target),
                ("status", "200".to_owned()),
            ];
            if let Err(e) = self
                .store
                .append_audit(&fields, config.api.audit_length)
                .await
            {
                tracing::warn!(error = %e, "the audit trail could not be written to Redis (the log has the change)");
            }
        }
    }

    pub fn take_reload_requests(&mut self) -> tokio::sync::mpsc::Receiver<api::ReloadRequest> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        self.reloads.send_if_modified(|taken| {
            let first = taken.is_none();
            if first {
                *taken = Some(tx);
            }
            first
        });
        rx
    }

    pub async fn stop(self) {
        self.work.cancel();
        let _ = self.work_task.await;
        self.election.cancel();
        let _ = self.election_task.await;
        let _ = self.inbox_task.await;
        // After the election: the term's end is in the history.
        self.registry.cancel();
        let _ = self.registry_task.await;
        self.api.cancel();
        if tokio::time::timeout(Duration::from_secs(5), self.api_task)
            .await
            .is_err()
        {
            tracing::warn!("API requests still in flight after 5s; closing anyway");
        }
        self.probe.cancel();
        let _ = self.probe_task.await;
        tracing::info!("delayq stopped");
    }
}

/// Runs until `shutdown` completes, then stops in order.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let daemon = start(config).await?;
    shutdown.await;
    tracing::info!("shutting down");
    daemon.stop().await;
    Ok(())
}

/// Keeps `store`'s streams kept apart those of the running configuration, until the
/// daemon drops its configuration channel.
async fn follow_kept_apart(store: Store, mut live: tokio::sync::watch::Receiver<Arc<Config>>) {
    while live.changed().await.is_ok() {
        let streams = live.borrow_and_update().kept_apart();
        store.keep_apart(streams);
    }
}
