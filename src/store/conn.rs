//! Where the store's commands go: one Redis, or the master that Sentinel names.
//!
//! [`Conn`] is the shared multiplexed connection every command goes through. On
//! one Redis it is a `ConnectionManager` (reconnecting by itself). Through
//! Sentinel it also follows failovers: when a command fails in a way a failover
//! explains (the connection broke or timed out, or the node answers READONLY
//! because it was made a replica), it asks the Sentinels for the master again, at
//! most every [`RESOLVE_EVERY`], and when they name another node (one that says it
//! is master) it moves every later command there. The failed command is not sent
//! again: callers retry as they do after any Redis error, so nothing is written
//! twice. Connections made apart (pub/sub, blocking reads) go to the current
//! master too ([`Conn::pubsub`], [`Conn::separate`]). It also listens to every
//! Sentinel's announcements: from the moment the Sentinel leading a failover of
//! this master says it promotes a replica until the new master is announced (at
//! most [`SWITCH_HOLD`]), commands wait, then go to the new master, so that
//! nothing is written to the old one after the promotion, where it would be
//! discarded when Sentinel makes it a replica (see [`announcement`]). With `redis.tls_server_name`
//! every connection is dialed by [`super::dial`] instead of the redis crate.
//! On Redis Cluster (`redis.mode = "cluster"`) it is the redis crate's cluster
//! connection, which follows MOVED and ASK redirections, retries TRYAGAIN and
//! reconnects by itself; pub/sub goes to a seed node (a PUBLISH reaches every node).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Cmd, ConnectionAddr, IntoConnectionInfo, Pipeline, RedisFuture, Value};
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::watch;
use tokio::time::Instant;

use super::dial::{Dialer, Redial};
use super::master;
use super::tls::{self, RedisTls};
use super::{Result, StoreConfig};
use crate::secret::RedisUrl;

/// Least time between two questions to the Sentinels.
const RESOLVE_EVERY: Duration = Duration::from_millis(100);

/// Longest wait of a command while a Sentinel fails the master over: Sentinel
/// announces the new master once its poll of the promoted replica (every second
/// during a failover) sees it promoted, about a second after promoting it.
/// Past this, commands go on to the master this connection knows.
pub(super) const SWITCH_HOLD: Duration = Duration::from_secs(3);

// What finding Redis again logs while it fails (asked for on every failed command,
// at most every RESOLVE_EVERY): one line per condition (see `complaint`).
static CLUSTER_UNREACHED: crate::complaint::Complaint = crate::complaint::Complaint::new(
    "cannot reach the Redis Cluster",
    "the Redis Cluster is reached again",
);
static NO_MASTER: crate::complaint::Complaint = crate::complaint::Complaint::new(
    "cannot find the Redis master through Sentinel",
    "Sentinel names the Redis master again",
);
static NEW_MASTER_UNREACHED: crate::complaint::Complaint = crate::complaint::Complaint::new(
    "cannot connect to the new Redis master",
    "connected to the new Redis master",
);

/// `redis.sentinel`: the master's name, the Sentinels, and how to reach them.
#[derive(Clone, Debug)]
pub struct SentinelConfig {
    pub master: String,
    /// host, port.
    pub nodes: Vec<(String, u16)>,
    /// ACL user on the Sentinels (with `password`).
    pub user: Option<String>,
    /// The Sentinels' password (`requirepass`, or the user's).
    pub password: Option<SecretString>,
    /// TLS to the Sentinels too.
    pub tls: bool,
}

/// The node commands go to now.
#[derive(Clone)]
struct Current {
    client: redis::Client,
    /// Set with `redis.tls_server_name`: connections are made through it.
    dialer: Option<Arc<Dialer>>,
    manager: Link,
    /// How many times the master has moved (0 on one Redis).
    generation: u64,
    /// How many times the connection was made anew: the master moved, or the
    /// cluster connection was renewed (the rights are checked again after each).
    renewals: u64,
}

/// The shared connection to one node: the redis crate's connection manager, or
/// delayq's own with `redis.tls_server_name`.
#[derive(Clone)]
enum Link {
    Manager(ConnectionManager),
    Redial(Redial),
    Cluster(ClusterConnection),
}

impl Link {
    fn get_db(&self) -> i64 {
        match self {
            Link::Manager(m) => m.get_db(),
            Link::Redial(r) => r.get_db(),
            Link::Cluster(_) => 0,
        }
    }
}

/// A connection apart from the shared one, for blocking reads: to the one node,
/// or a cluster connection of its own.
#[derive(Clone)]
pub(crate) enum Separate {
    Node(redis::aio::MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Separate {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Separate::Node(c) => c.req_packed_command(cmd),
            Separate::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Separate::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Separate::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Separate::Node(c) => c.get_db(),
            Separate::Cluster(_) => 0,
        }
    }
}

/// What a Redis Cluster connection needs: the client (its seeds and settings)
/// and the seeds' plain clients, for pub/sub.
struct Cluster {
    client: ClusterClient,
    seeds: Vec<redis::Client>,
    /// The seeds' scheme, user, password and TLS settings, for a client of any
    /// node (see [`node_client`]): presence's pub/sub (the daemon's).
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    info: redis::ConnectionInfo,
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    tls: Option<RedisTls>,
    response_timeout: Duration,
    connect_timeout: Duration,
    /// When the connection was last made anew (see [`Conn::reconnect_cluster`]).
    renewed: tokio::sync::Mutex<Option<Instant>>,
}

/// The shared connection. Cheap to clone: clones share the node and the Sentinels.
#[derive(Clone)]
pub(super) struct Conn {
    current: Arc<Mutex<Current>>,
    sentinel: Option<Arc<Follow>>,
    cluster: Option<Arc<Cluster>>,
    /// A pinned connection refuses every command once the master has moved from
    /// this generation (see [`Conn::pinned`]).
    pin: Option<u64>,
}

/// What following the master through Sentinel needs.
struct Follow {
    /// The master's name.
    master: String,
    client: tokio::sync::Mutex<SentinelClient>,
    manager_config: ConnectionManagerConfig,
    connect_timeout: Duration,
    /// When the Sentinels were last asked.
    asked: Mutex<Option<Instant>>,
    /// The master's address, each time it changes (a count of changes and the address).
    changes: watch::Sender<(u64, String)>,
    /// A client of each Sentinel, for its announcements.
    sentinels: Vec<redis::Client>,
    /// How to reach a data node (user, password, database, TLS) at an address
    /// a Sentinel announces.
    data: redis::ConnectionInfo,
    tls: Option<RedisTls>,
    /// The Sentinels (by index into `sentinels`) that announced a failover of
    /// the master under way, and since when: commands wait meanwhile.
    switching: watch::Sender<BTreeMap<usize, Instant>>,
}

impl Follow {
    /// Waits while a Sentinel fails the master over (see [`SWITCH_HOLD`]).
    async fn hold(&self) {
        let until = match self.switching.borrow().values().min() {
            None => return,
            Some(since) => *since + SWITCH_HOLD,
        };
        if Instant::now() >= until {
            return;
        }
        let mut switching = self.switching.subscribe();
        let _ = tokio::time::timeout_at(until, switching.wait_for(BTreeMap::is_empty)).await;
    }
}

impl Conn {
    pub(super) async fn connect(config: &StoreConfig) -> Result<Conn> {
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(config.response_timeout))
            .set_connection_timeout(Some(config.connect_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        if let Some(seeds) = &config.cluster {
            return Conn::connect_cluster(config, seeds).await;
        }
        let Some(sentinel) = &config.sentinel else {
            let client = tls::client(&config.url, config.tls.as_ref())?;
            let server_name = config
                .tls
                .as_ref()
                .and_then(|t| Some((t, t.server_name.as_deref()?)));
            let (dialer, manager) = match server_name {
                Some((tls, name)) => {
                    let dialer = Arc::new(Dialer::new(&client, tls, name, config.connect_timeout)?);
                    let shared = redis::AsyncConnectionConfig::new()
                        .set_response_timeout(Some(config.response_timeout))
                        .set_connection_timeout(Some(config.connect_timeout));
                    let redial = Redial::connect(dialer.clone(), shared).await?;
                    (Some(dialer), Link::Redial(redial))
                }
                None => {
                    let manager =
                        ConnectionManager::new_with_config(client.clone(), manager_config).await?;
                    (None, Link::Manager(manager))
                }
            };
            return Ok(Conn {
                current: Arc::new(Mutex::new(Current {
                    client,
                    dialer,
                    manager,
                    generation: 0,
                    renewals: 0,
                })),
                sentinel: None,
                cluster: None,
                pin: None,
            });
        };
        let sentinel_client = sentinel_client(&config.url, config.tls.as_ref(), sentinel)?;
        let sentinels = sentinel_clients(config.tls.as_ref(), sentinel)?;
        let data = config.url.expose().into_connection_info()?;
        let client = tokio::time::timeout(
            config.connect_timeout * 2,
            master::ask_master(
                &sentinels,
                &sentinel.master,
                &data,
                config.tls.as_ref(),
                config.connect_timeout,
            ),
        )
        .await
        .map_err(|_| timeout("no Sentinel named a master in time"))??;
        let manager =
            ConnectionManager::new_with_config(client.clone(), manager_config.clone()).await?;
        let address = shown(client.get_connection_info().addr());
        tracing::info!(master = %sentinel.master, %address, "Sentinel names the Redis master");
        let conn = Conn {
            current: Arc::new(Mutex::new(Current {
                client,
                dialer: None,
                manager: Link::Manager(manager),
                generation: 0,
                renewals: 0,
            })),
            pin: None,
            cluster: None,
            sentinel: Some(Arc::new(Follow {
                master: sentinel.master.clone(),
                client: tokio::sync::Mutex::new(sentinel_client),
                manager_config,
                connect_timeout: config.connect_timeout,
                asked: Mutex::new(None),
                changes: watch::channel((0, address)).0,
                sentinels,
                data,
                tls: config.tls.clone(),
                switching: watch::channel(BTreeMap::new()).0,
            })),
        };
        conn.watch_announcements();
        Ok(conn)
    }

    /// Connects to Redis Cluster through `seeds` (host, port), with the URL's
    /// scheme, user, password and TLS settings.
    async fn connect_cluster(config: &StoreConfig, seeds: &[(String, u16)]) -> Result<Conn> {
        let first = tls::client(&config.url, config.tls.as_ref())?;
        let info = first.get_connection_info().clone();
        let mut clients = Vec::with_capacity(seeds.len());
        let mut infos = Vec::with_capacity(seeds.len());
        for (host, port) in seeds {
            let (seed, client) = node_client(&info, config.tls.as_ref(), host, *port)?;
            infos.push(seed);
            clients.push(client);
        }
        let mut builder = ClusterClientBuilder::new(infos)
            .connection_timeout(config.connect_timeout)
            .response_timeout(config.response_timeout)
            .retries(3)
            .min_retry_wait(20)
            .max_retry_wait(500);
        if matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
            builder = builder.tls(redis::TlsMode::Secure);
            if let Some(t) = config.tls.as_ref() {
                builder = builder.certs(tls::certificates(t));
            }
        }
        let client = builder.build()?;
        let connection = tokio::time::timeout(
            config.connect_timeout * 2,
            client.get_async_connection_with_config(cluster_config(config.response_timeout)),
        )
        .await
        .map_err(|_| timeout("no Redis Cluster seed node answered in time"))??;
        Ok(Conn {
            current: Arc::new(Mutex::new(Current {
                client: first,
                dialer: None,
                manager: Link::Cluster(connection),
                generation: 0,
                renewals: 0,
            })),
            sentinel: None,
            cluster: Some(Arc::new(Cluster {
                client,
                seeds: clients,
                info,
                tls: config.tls.clone(),
                response_timeout: config.response_timeout,
                connect_timeout: config.connect_timeout,
                renewed: tokio::sync::Mutex::new(None),
            })),
            pin: None,
        })
    }

    /// `cmd` sent to the master of `slot` on Redis Cluster (whatever keys it
    /// names, or none), to the current node otherwise.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(super) async fn on_master_of(&self, slot: u16, cmd: Cmd) -> redis::RedisResult<Value> {
        match self.manager()? {
            Link::Cluster(mut cluster) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let route = Route::new(slot, SlotAddr::Master);
                cluster
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await
            }
            _ => cmd.query_async(&mut self.clone()).await,
        }
    }

    /// `cmd` on every master, each reply under the master's address ("host:port");
    /// on one Redis (or through Sentinel) the current node's reply alone, under
    /// `None`. A master's error fails the whole.
    pub(super) async fn on_every_master(
        &self,
        cmd: Cmd,
    ) -> redis::RedisResult<Vec<(Option<String>, Value)>> {
        match self.manager()? {
            Link::Cluster(mut cluster) => {
                use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
                // No response policy: the replies come as a map keyed by address.
                let reply = cluster
                    .route_command(
                        cmd,
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await?;
                let Value::Map(replies) = reply else {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Parse,
                        "a reply from every master was expected",
                    )));
                };
                replies
                    .into_iter()
                    .map(|(address, reply)| {
                        let address: String = redis::from_redis_value(address)?;
                        match reply {
                            Value::ServerError(e) => Err(e.into()),
                            reply => Ok((Some(address), reply)),
                        }
                    })
                    .collect()
            }
            _ => Ok(vec![(None, cmd.query_async(&mut self.clone()).await?)]),
        }
    }

    /// `cmd` on the master at `address` (as [`Conn::on_every_master`] names it)
    /// on Redis Cluster; on the current node for `None`.
    pub(super) async fn on_node(
        &self,
        address: Option<&str>,
        cmd: Cmd,
    ) -> redis::RedisResult<Value> {
        match (self.manager()?, address) {
            (Link::Cluster(mut cluster), Some(address)) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let (host, port) = address
                    .rsplit_once(':')
                    .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
                    .ok_or_else(|| {
                        redis::RedisError::from((
                            redis::ErrorKind::Client,
                            "not a host:port address",
                            address.to_owned(),
                        ))
                    })?;
                cluster
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port }),
                    )
                    .await
            }
            _ => cmd.query_async(&mut self.clone()).await,
        }
    }

    /// Whether this is a Redis Cluster connection.
    pub(super) fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// A connection apart from this one for blocking reads, without a response
    /// timeout (`config` says so for one node): to the current node, or a cluster
    /// connection.
    pub(super) async fn separate_any(
        &self,
        config: &redis::AsyncConnectionConfig,
    ) -> redis::RedisResult<Separate> {
        match &self.cluster {
            Some(cluster) => {
                // The cluster connection wants a timeout: a day is none.
                let c = ClusterConfig::new().set_response_timeout(Duration::from_secs(24 * 3600));
                Ok(Separate::Cluster(
                    cluster.client.get_async_connection_with_config(c).await?,
                ))
            }
            None => Ok(Separate::Node(self.separate(config).await?)),
        }
    }

    /// A pub/sub connection to the current node (Redis Cluster: the first seed
    /// that answers).
    pub(super) async fn pubsub(&self) -> redis::RedisResult<redis::aio::PubSub> {
        if let Some(cluster) = &self.cluster {
            let mut last = None;
            for seed in &cluster.seeds {
                match seed.get_async_pubsub().await {
                    Ok(pubsub) => return Ok(pubsub),
                    Err(e) => last = Some(e),
                }
            }
            return Err(last.unwrap_or_else(|| timeout("no Redis Cluster seed node")));
        }
        let (client, dialer) = self.node();
        match dialer {
            Some(dialer) => dialer.pubsub().await,
            None => client.get_async_pubsub().await,
        }
    }

    /// A pub/sub connection to the node that commands on `slot`'s keys reach: the
    /// master of `slot` on Redis Cluster (as that master itself says: see
    /// [`Conn::master_address`]), with its address; the current node otherwise (no
    /// address: it follows the node).
    #[cfg(feature = "server")]
    pub(super) async fn pubsub_on_master_of(
        &self,
        slot: u16,
    ) -> redis::RedisResult<(redis::aio::PubSub, Option<(String, u16)>)> {
        let Some(cluster) = &self.cluster else {
            return Ok((self.pubsub().await?, None));
        };
        let Some((host, port)) = self.master_address(slot).await? else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no address for the slot's master in CLUSTER SLOTS",
            )));
        };
        let (_, client) = node_client(&cluster.info, cluster.tls.as_ref(), &host, port)?;
        Ok((client.get_async_pubsub().await?, Some((host, port))))
    }

    /// Redis Cluster: the address of `slot`'s master, from the `CLUSTER SLOTS` of
    /// the node this connection sends the slot's commands to (a master that gave
    /// the slot away names its new owner). None where the reply names none.
    #[cfg(feature = "server")]
    pub(super) async fn master_address(
        &self,
        slot: u16,
    ) -> redis::RedisResult<Option<(String, u16)>> {
        let slots = self
            .on_master_of(slot, redis::cmd("CLUSTER").arg("SLOTS").clone())
            .await?;
        Ok(slot_master(&slots, slot))
    }

    /// A multiplexed connection to the current node, apart from this one.
    pub(super) async fn separate(
        &self,
        config: &redis::AsyncConnectionConfig,
    ) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let (client, dialer) = self.node();
        match dialer {
            Some(dialer) => dialer.multiplexed(config).await,
            None => {
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
        }
    }

    fn node(&self) -> (redis::Client, Option<Arc<Dialer>>) {
        let current = self.current.lock().expect("not poisoned");
        (current.client.clone(), current.dialer.clone())
    }

    /// This connection, refusing every command once the master has moved from the
    /// one it reaches now: a leader's term works through one, so that none of its
    /// writes reaches a new master (whose fences may have gone back with the writes
    /// a failover lost) before a new term has raised them there.
    pub(super) fn pinned(&self) -> Conn {
        let generation = self.current.lock().expect("not poisoned").generation;
        Conn {
            pin: Some(generation),
            ..self.clone()
        }
    }

    pub(super) fn pin(&self) -> Option<u64> {
        self.pin
    }

    /// The manager to send through, or the refusal of a pinned connection.
    fn manager(&self) -> redis::RedisResult<Link> {
        let current = self.current.lock().expect("not poisoned");
        match self.pin {
            Some(pin) if pin != current.generation => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the Redis master moved since this term began",
            ))),
            _ => Ok(current.manager.clone()),
        }
    }

    /// How many times the connection was made anew (a master moved, the cluster
    /// connection renewed); the redis crate's own reconnections are not counted.
    pub(super) fn renewals(&self) -> u64 {
        self.current.lock().expect("not poisoned").renewals
    }

    /// Master changes through Sentinel (a count and the new address); None on one Redis.
    pub(super) fn master_changes(&self) -> Option<watch::Receiver<(u64, String)>> {
        self.sentinel.as_ref().map(|f| f.changes.subscribe())
    }

    /// `SENTINEL <subcommand> <master>`, asked of the first Sentinel that answers.
    async fn ask_sentinel<T: redis::FromRedisValue>(
        &self,
        subcommand: &str,
    ) -> redis::RedisResult<T> {
        let Some(f) = &self.sentinel else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "not connected through Sentinel (redis.sentinel)",
            )));
        };
        let client = {
            let mut sentinel = f.client.lock().await;
            tokio::time::timeout(f.connect_timeout, sentinel.async_get_sentinel_client())
                .await
                .map_err(|_| timeout("no Sentinel answered in time"))??
        };
        let mut connection =
            tokio::time::timeout(f.connect_timeout, client.get_multiplexed_async_connection())
                .await
                .map_err(|_| timeout("no Sentinel answered in time"))??;
        redis::cmd("SENTINEL")
            .arg(subcommand)
            .arg(&f.master)
            .query_async(&mut connection)
            .await
    }

    /// `SENTINEL FAILOVER` of the master, on the first Sentinel that answers.
    pub(super) async fn sentinel_failover(&self) -> redis::RedisResult<()> {
        self.ask_sentinel("FAILOVER").await
    }

    /// Whether every replica the Sentinels know of the master (`SENTINEL
    /// REPLICAS`) says it is a replica of the master this connection follows,
    /// with its link up (asked directly: Sentinel polls replicas every 10 s).
    /// After a planned failover the old master goes on as a master until
    /// Sentinel makes it a replica; a second failover before that can promote it
    /// with what it had, and what the new master took meanwhile is discarded.
    pub(super) async fn replicas_in_sync(&self) -> redis::RedisResult<bool> {
        let replicas: Vec<std::collections::HashMap<String, String>> =
            self.ask_sentinel("REPLICAS").await?;
        let f = self.sentinel.as_ref().expect("asked through Sentinel");
        let master = f.changes.borrow().1.clone();
        let mut in_sync = !replicas.is_empty();
        for replica in &replicas {
            let (Some(host), Some(port)) = (
                replica.get("ip"),
                replica.get("port").and_then(|p| p.parse().ok()),
            ) else {
                return Ok(false);
            };
            let (_, client) = node_client(&f.data, f.tls.as_ref(), host, port)?;
            let info = async {
                let mut c = client.get_multiplexed_async_connection().await?;
                redis::cmd("INFO")
                    .arg("replication")
                    .query_async::<String>(&mut c)
                    .await
            };
            let info = tokio::time::timeout(f.connect_timeout, info)
                .await
                .map_err(|_| timeout("a replica did not answer in time"))??;
            let field = |name: &str| super::info_value(&info, name);
            let of = format!(
                "{}:{}",
                field("master_host").unwrap_or_default(),
                field("master_port").unwrap_or_default()
            );
            in_sync &= field("role") == Some("slave")
                && field("master_link_status") == Some("up")
                && of == master;
        }
        Ok(in_sync)
    }

    /// After a failed command: asks the Sentinels again if a failover may explain
    /// it; on Redis Cluster, makes the connection anew.
    async fn after(&self, error: &redis::RedisError) {
        let failover_sign = error.is_io_error()
            || error.is_timeout()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"));
        if self.cluster.is_some() {
            let cluster_sign = failover_sign
                || matches!(
                    error.kind(),
                    redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown)
                )
                || error.to_string().contains("ClusterConnectionNotFound");
            if cluster_sign {
                self.reconnect_cluster().await;
            }
            return;
        }
        if self.sentinel.is_none() {
            return;
        }
        if failover_sign {
            self.follow(false).await;
        }
    }

    /// Replaces the cluster connection with a new one, which learns the cluster's
    /// shape afresh from the seeds, at most every [`RESOLVE_EVERY`] × 5. After a
    /// master died, the redis crate's connection went on waiting for it (every
    /// command timing out, whichever node it was for) well after its replica took
    /// over; a new connection routes to the promoted replica at once.
    async fn reconnect_cluster(&self) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let Ok(mut renewed) = cluster.renewed.try_lock() else {
            return; // another caller is at it
        };
        if renewed.is_some_and(|at| at.elapsed() < RESOLVE_EVERY * 5) {
            return;
        }
        *renewed = Some(Instant::now());
        let made = tokio::time::timeout(
            cluster.connect_timeout * 2,
            cluster
                .client
                .get_async_connection_with_config(cluster_config(cluster.response_timeout)),
        )
        .await;
        match made {
            Ok(Ok(connection)) => {
                let mut current = self.current.lock().expect("not poisoned");
                current.manager = Link::Cluster(connection);
                current.renewals += 1;
                tracing::debug!("Redis Cluster connection made anew");
                drop(current);
                if let Some(said) = CLUSTER_UNREACHED.recovered() {
                    tracing::info!("{said}");
                }
            }
            Ok(Err(e)) => {
                if let Some(said) = CLUSTER_UNREACHED.failed() {
                    tracing::warn!(error = %e, "{said}");
                }
            }
            Err(_) => {
                if let Some(said) = CLUSTER_UNREACHED.failed() {
                    tracing::warn!(error = %"no seed node answered in time", "{said}");
                }
            }
        }
    }

    /// Asks the Sentinels for the master (`anyway`: even if asked just now) and
    /// moves to it if it is another node.
    async fn follow(&self, anyway: bool) {
        let Some(follow) = &self.sentinel else {
            return;
        };
        {
            let mut asked = follow.asked.lock().expect("not poisoned");
            if !anyway && asked.is_some_and(|at| at.elapsed() < RESOLVE_EVERY) {
                return;
            }
            *asked = Some(Instant::now());
        }
        // One asker at a time.
        let sentinel = follow.client.lock().await;
        let found = tokio::time::timeout(
            follow.connect_timeout * 2,
            master::ask_master(
                &follow.sentinels,
                &follow.master,
                &follow.data,
                follow.tls.as_ref(),
                follow.connect_timeout,
            ),
        );
        let client = match found.await {
            Ok(Ok(client)) => {
                if let Some(said) = NO_MASTER.recovered() {
                    tracing::info!("{said}");
                }
                client
            }
            Ok(Err(e)) => {
                if let Some(said) = NO_MASTER.failed() {
                    tracing::warn!(error = %e, "{said}");
                }
                return;
            }
            Err(_) => {
                if let Some(said) = NO_MASTER.failed() {
                    tracing::warn!(error = %"no Sentinel named a master in time", "{said}");
                }
                return;
            }
        };
        drop(sentinel);
        self.move_to(follow, client).await;
    }

    /// Moves to the master a Sentinel announced at `host:port` (asking the
    /// Sentinels again could reach one that has not heard of the switch yet).
    async fn follow_to(&self, host: &str, port: u16) {
        let Some(follow) = &self.sentinel else {
            return;
        };
        match node_client(&follow.data, follow.tls.as_ref(), host, port) {
            Ok((_, client)) => self.move_to(follow, client).await,
            Err(e) => {
                tracing::warn!(error = %e, host, port, "cannot reach the announced Redis master")
            }
        }
    }

    /// Moves every later command to the master `client` reaches, if it is another node.
    async fn move_to(&self, follow: &Follow, client: redis::Client) {
        let address = shown(client.get_connection_info().addr());
        if address == follow.changes.borrow().1 {
            return;
        }
        let made = tokio::time::timeout(
            follow.connect_timeout * 2,
            ConnectionManager::new_with_config(client.clone(), follow.manager_config.clone()),
        )
        .await;
        let mut manager = match made {
            Ok(Ok(manager)) => {
                if let Some(said) = NEW_MASTER_UNREACHED.recovered() {
                    tracing::info!(%address, "{said}");
                }
                manager
            }
            Ok(Err(e)) => {
                if let Some(said) = NEW_MASTER_UNREACHED.failed() {
                    tracing::warn!(error = %e, %address, "{said}");
                }
                return;
            }
            Err(_) => {
                if let Some(said) = NEW_MASTER_UNREACHED.failed() {
                    tracing::warn!(error = %"no answer in time", %address, "{said}");
                }
                return;
            }
        };
        // Never to a replica: only a node that says it is a master (in its HELLO
        // reply, which a least-privilege user may ask for, unlike ROLE).
        match master::says_master(&mut manager, follow.connect_timeout).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(%address, "not moving to a node that does not say it is a master");
                return;
            }
            Err(e) if e.code() == Some("NOPERM") => {
                tracing::warn!(error = %e, %address, "cannot follow the Redis master: the Redis user may not run HELLO (see docs/redis-rights.md)");
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, %address, "not moving to a node that did not say what it is");
                return;
            }
        }
        {
            let mut current = self.current.lock().expect("not poisoned");
            *current = Current {
                client,
                dialer: None,
                manager: Link::Manager(manager),
                generation: current.generation + 1,
                renewals: current.renewals + 1,
            };
        }
        tracing::warn!(%address, "the Redis master moved (Sentinel failover): following it");
        follow
            .changes
            .send_modify(|(count, at)| (*count, *at) = (*count + 1, address));
    }

    /// Follows every Sentinel's announcements while this connection is in use:
    /// a failover is followed when announced, not only when a command fails on
    /// the old master (which, demoted in a planned failover, may go on taking
    /// writes for a while), and commands wait while one is under way.
    fn watch_announcements(&self) {
        let Some(follow) = &self.sentinel else {
            return;
        };
        for sentinel in 0..follow.sentinels.len() {
            let (current, follow) = (Arc::downgrade(&self.current), Arc::downgrade(follow));
            tokio::spawn(async move {
                let mut delay = Duration::from_millis(100);
                while current.strong_count() > 0 {
                    let started = Instant::now();
                    if let Err(e) = listen(&current, &follow, sentinel).await {
                        tracing::debug!(error = %e, sentinel, "Sentinel announcements lost; listening again");
                    }
                    // Its failover, if it announced one, is no longer heard of.
                    if let Some(f) = follow.upgrade() {
                        f.switching
                            .send_if_modified(|s| s.remove(&sentinel).is_some());
                    }
                    if started.elapsed() > Duration::from_secs(10) {
                        delay = Duration::from_millis(100);
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            });
        }
    }
}

/// The connection behind weak references, while anybody still uses it.
fn upgrade(current: &Weak<Mutex<Current>>, follow: &Weak<Follow>) -> Option<Conn> {
    Some(Conn {
        current: current.upgrade()?,
        sentinel: Some(follow.upgrade()?),
        cluster: None,
        pin: None,
    })
}

/// What a Sentinel announces about the master a connection follows.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Announcement {
    /// It is about to promote a replica (`+failover-state-send-slaveof-noone`):
    /// from now on, writes to the old master may be discarded.
    Switching,
    /// Its failover ended without a switch (`-failover-abort-*`).
    Aborted,
    /// The master is now at this address (`+switch-master`).
    Switched { host: String, port: u16 },
}

/// The channels a Sentinel announces on that [`announcement`] reads.
const ANNOUNCED: [&str; 2] = ["+switch-master", "+failover-state-send-slaveof-noone"];
const ABORTS: &str = "-failover-abort-*";

/// What a Sentinel's message on `channel` says about the master named `master`
/// (None: nothing, or about another master).
pub(super) fn announcement(channel: &str, payload: &str, master: &str) -> Option<Announcement> {
    let words: Vec<&str> = payload.split(' ').collect();
    match channel {
        // "<name> <old ip> <old port> <new ip> <new port>"
        "+switch-master" => match words[..] {
            [name, _, _, host, port] if name == master => Some(Announcement::Switched {
                host: host.to_owned(),
                port: port.parse().ok()?,
            }),
            _ => None,
        },
        // "slave <ip>:<port> <ip> <port> @ <name> <master ip> <master port>"
        "+failover-state-send-slaveof-noone" => match words[..] {
            ["slave", _, _, _, "@", name, _, _] if name == master => Some(Announcement::Switching),
            _ => None,
        },
        // "master <name> <ip> <port>"
        _ if channel.starts_with("-failover-abort-") => match words[..] {
            ["master", name, ..] if name == master => Some(Announcement::Aborted),
            _ => None,
        },
        _ => None,
    }
}

/// Listens to one Sentinel's announcements until its connection ends or the
/// connection they are for is dropped.
async fn listen(
    current: &Weak<Mutex<Current>>,
    follow: &Weak<Follow>,
    sentinel: usize,
) -> redis::RedisResult<()> {
    let Some(conn) = upgrade(current, follow) else {
        return Ok(());
    };
    let f = conn.sentinel.clone().expect("a Sentinel connection");
    let mut pubsub =
        tokio::time::timeout(f.connect_timeout, f.sentinels[sentinel].get_async_pubsub())
            .await
            .map_err(|_| timeout("no Sentinel answered in time"))??;
    pubsub.subscribe(&ANNOUNCED[..]).await?;
    pubsub.psubscribe(ABORTS).await?;
    // Asked once more now: a switch announced while nobody listened.
    conn.follow(true).await;
    let master = f.master.clone();
    drop((conn, f));
    let mut messages = pubsub.into_on_message();
    let mut check = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            message = messages.next() => {
                let Some(message) = message else { return Ok(()) };
                let payload: String = message.get_payload().unwrap_or_default();
                let Some(said) = announcement(message.get_channel_name(), &payload, &master) else {
                    continue;
                };
                let Some(conn) = upgrade(current, follow) else { return Ok(()) };
                let f = conn.sentinel.as_ref().expect("a Sentinel connection");
                match said {
                    Announcement::Switching => {
                        let mut first = false;
                        f.switching.send_modify(|s| {
                            first = s.is_empty();
                            s.insert(sentinel, Instant::now());
                        });
                        if first {
                            tracing::warn!(
                                master,
                                "Sentinel is failing the Redis master over: commands wait for the new master (at most {})",
                                crate::human::duration(SWITCH_HOLD)
                            );
                        }
                    }
                    Announcement::Aborted => {
                        f.switching.send_if_modified(|s| s.remove(&sentinel).is_some());
                    }
                    Announcement::Switched { host, port } => {
                        conn.follow_to(&host, port).await;
                        f.switching.send_if_modified(|s| {
                            let held = !s.is_empty();
                            s.clear();
                            held
                        });
                    }
                }
            }
            _ = check.tick() => if current.strong_count() == 0 { return Ok(()) },
        }
    }
}

/// A connection ready for one command, and what to tell if the command fails.
enum Live {
    Manager(ConnectionManager),
    Dialed(redis::aio::MultiplexedConnection, Redial, u64),
    Cluster(ClusterConnection),
}

impl Live {
    fn connection(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Live::Manager(m) => m,
            Live::Dialed(c, ..) => c,
            Live::Cluster(c) => c,
        }
    }
}

impl Conn {
    /// The connection to send the next command on (refused on a pinned one once
    /// the master has moved).
    async fn live(&self) -> redis::RedisResult<Live> {
        if let Some(follow) = &self.sentinel {
            follow.hold().await;
        }
        Ok(match self.manager()? {
            Link::Manager(m) => Live::Manager(m),
            Link::Cluster(c) => Live::Cluster(c),
            Link::Redial(r) => {
                let (number, connection) = r.connection().await?;
                Live::Dialed(connection, r, number)
            }
        })
    }

    /// After a command on `live` failed.
    async fn failed(&self, live: Live, error: &redis::RedisError) {
        if let Live::Dialed(_, redial, number) = live {
            redial.failed(number, error).await;
        }
        self.after(error).await;
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut live = self.live().await?;
            let result = live.connection().req_packed_command(cmd).await;
            if let Err(e) = &result {
                self.failed(live, e).await;
            }
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut live = self.live().await?;
            let result = live
                .connection()
                .req_packed_commands(pipeline, offset, count)
                .await;
            if let Err(e) = &result {
                self.failed(live, e).await;
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.current.lock().expect("not poisoned").manager.get_db()
    }
}

/// The Sentinel client: the data URL gives the data nodes' user, password,
/// database and TLS; `sentinel` the Sentinels' own.
fn sentinel_client(
    url: &RedisUrl,
    tls: Option<&RedisTls>,
    sentinel: &SentinelConfig,
) -> Result<SentinelClient> {
    let info = url.expose().into_connection_info()?;
    let data = info.redis_settings();
    let data_tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    let addr = |host: &str, port: u16| {
        if sentinel.tls {
            ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        }
    };
    let nodes = sentinel.nodes.iter().map(|(host, port)| addr(host, *port));
    let mut builder =
        SentinelClientBuilder::new(nodes, &sentinel.master, SentinelServerType::Master)?
            .set_client_to_redis_db(data.db());
    if let Some(user) = data.username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = data.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    let certificates = tls.map(tls::certificates);
    if data_tls {
        builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
        if let Some(certificates) = &certificates {
            builder = builder.set_client_to_redis_certificates(certificates.clone());
        }
    }
    if sentinel.tls {
        builder = builder.set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
        if let Some(certificates) = certificates {
            builder = builder.set_client_to_sentinel_certificates(certificates);
        }
    }
    if let Some(user) = &sentinel.user {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = &sentinel.password {
        builder = builder.set_client_to_sentinel_password(password.expose_secret());
    }
    Ok(builder.build()?)
}

/// A client of each Sentinel: its address, its own user and password, TLS to
/// it when `sentinel.tls` (with the certificates of `redis.tls`).
fn sentinel_clients(
    tls: Option<&RedisTls>,
    sentinel: &SentinelConfig,
) -> Result<Vec<redis::Client>> {
    let mut settings = redis::RedisConnectionInfo::default();
    if let Some(user) = &sentinel.user {
        settings = settings.set_username(user);
    }
    if let Some(password) = &sentinel.password {
        settings = settings.set_password(password.expose_secret());
    }
    let mut clients = Vec::with_capacity(sentinel.nodes.len());
    for (host, port) in &sentinel.nodes {
        let addr = if sentinel.tls {
            ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.clone(), *port)
        };
        let info = addr
            .into_connection_info()?
            .set_redis_settings(settings.clone());
        clients.push(match tls {
            Some(t) if sentinel.tls => redis::Client::build_with_tls(info, tls::certificates(t))?,
            _ => redis::Client::open(info)?,
        });
    }
    Ok(clients)
}

/// An address as logs show it (no credentials are part of one).
fn shown(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        ConnectionAddr::Unix(path) => path.display().to_string(),
        other => format!("{other:?}"),
    }
}

/// The cluster connection's settings: `response_timeout` per command (the redis
/// crate's default would be 500 ms).
fn cluster_config(response_timeout: Duration) -> ClusterConfig {
    ClusterConfig::new().set_response_timeout(response_timeout)
}

fn timeout(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, what))
}

/// A plain client of the cluster node at `host`:`port`, with `info`'s scheme,
/// user, password and TLS settings, and its connection info.
pub(super) fn node_client(
    info: &redis::ConnectionInfo,
    tls: Option<&RedisTls>,
    host: &str,
    port: u16,
) -> redis::RedisResult<(redis::ConnectionInfo, redis::Client)> {
    let addr = match info.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: *insecure,
            tls_params: None,
        },
        _ => ConnectionAddr::Tcp(host.to_owned(), port),
    };
    let node = info.clone().set_addr(addr);
    let client = match tls {
        Some(t) => redis::Client::build_with_tls(node.clone(), tls::certificates(t))?,
        None => redis::Client::open(node.clone())?,
    };
    Ok((node, client))
}

/// The master's address for `slot` in a `CLUSTER SLOTS` reply (ranges of
/// `[start, end, [host, port, id, …], replicas…]`); None where the reply has no
/// such range or its master has no address.
pub fn slot_master(reply: &Value, slot: u16) -> Option<(String, u16)> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    ranges.iter().find_map(|range| {
        let Value::Array(parts) = range else {
            return None;
        };
        let int = |v: &Value| redis::from_redis_value::<i64>(v.clone()).ok();
        let (start, end) = (int(parts.first()?)?, int(parts.get(1)?)?);
        if !(start..=end).contains(&i64::from(slot)) {
            return None;
        }
        let Value::Array(master) = parts.get(2)? else {
            return None;
        };
        let host: String = redis::from_redis_value(master.first()?.clone()).ok()?;
        let port = u16::try_from(int(master.get(1)?)?).ok()?;
        (!host.is_empty() && host != "?").then_some((host, port))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_announcement(channel: &str, payload: &str, expected: Option<Announcement>) {
        assert_eq!(
            announcement(channel, payload, "main"),
            expected,
            "{channel} {payload}"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_message_is_read_without_panic_and_only_about_this_master(
            channel in "[-+](switch-master|failover-state-send-slaveof-noone|failover-abort-[a-z-]{0,12}|[a-z-]{0,20})",
            payload in "((main|other|slave|master|@|[0-9.:]{1,15}|\\PC{0,6}) ?){0,9}",
        ) {
            if announcement(&channel, &payload, "main").is_some() {
                proptest::prop_assert!(payload.split(' ').any(|w| w == "main"), "{channel} {payload}");
            }
        }
    }

    #[test]
    fn announcements_about_this_master_are_read_and_others_ignored() {
        let switched = |host: &str, port| {
            Some(Announcement::Switched {
                host: host.into(),
                port,
            })
        };
        let promoting = "+failover-state-send-slaveof-noone";
        check_announcement(
            "+switch-master",
            "main 10.0.0.1 6379 10.0.0.2 6380",
            switched("10.0.0.2", 6380),
        );
        check_announcement("+switch-master", "other 10.0.0.1 6379 10.0.0.2 6380", None);
        check_announcement("+switch-master", "main 10.0.0.1 6379 10.0.0.2 port", None);
        check_announcement("+switch-master", "main 10.0.0.1 6379", None);
        check_announcement("+switch-master", "", None);
        check_announcement(
            promoting,
            "slave 10.0.0.2:6380 10.0.0.2 6380 @ main 10.0.0.1 6379",
            Some(Announcement::Switching),
        );
        check_announcement(
            promoting,
            "slave 10.0.0.2:6380 10.0.0.2 6380 @ mainly 10.0.0.1 6379",
            None,
        );
        check_announcement(promoting, "master main 10.0.0.1 6379", None);
        check_announcement(
            "-failover-abort-not-elected",
            "master main 10.0.0.1 6379",
            Some(Announcement::Aborted),
        );
        check_announcement(
            "-failover-abort-no-good-slave",
            "master main 10.0.0.1 6379",
            Some(Announcement::Aborted),
        );
        check_announcement(
            "-failover-abort-slave-timeout",
            "master other 10.0.0.1 6379",
            None,
        );
        check_announcement("+sdown", "master main 10.0.0.1 6379", None);
        check_announcement(
            "+promoted-slave",
            "slave 10.0.0.2:6380 10.0.0.2 6380 @ main 10.0.0.1 6379",
            None,
        );
    }

    fn range(start: i64, end: i64, master: Vec<Value>) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(master),
        ])
    }

    fn node(host: &str, port: i64) -> Vec<Value> {
        vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"0123abcd".to_vec()),
        ]
    }

    #[test]
    #[rustfmt::skip]
    fn the_slots_master_is_read_from_cluster_slots() {
        let reply = Value::Array(vec![
            range(0, 5460, node("10.0.0.1", 7000)),
            range(5461, 10922, node("redis-2", 7001)),
            range(10923, 16383, node("", 7002)),
        ]);
        assert_eq!(slot_master(&reply, 0), Some(("10.0.0.1".into(), 7000)));
        assert_eq!(slot_master(&reply, 5460), Some(("10.0.0.1".into(), 7000)));
        assert_eq!(slot_master(&reply, 5461), Some(("redis-2".into(), 7001)));
        assert_eq!(slot_master(&reply, 16383), None, "no address");
        assert_eq!(slot_master(&Value::Array(vec![]), 1), None, "no range");
        assert_eq!(slot_master(&Value::Nil, 1), None, "not a reply of ranges");
        assert_eq!(slot_master(&Value::Array(vec![Value::Int(3)]), 1), None, "short range");
        assert_eq!(slot_master(&Value::Array(vec![range(0, 9, node("h", 70000))]), 1), None, "port");
    }
}
