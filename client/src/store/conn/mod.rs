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
//! twice. Connections made apart go to the current master too: pub/sub
//! ([`Conn::pubsub`]) and blocking reads, which also follow it when it moves
//! (`separate.rs`). It also listens to every
//! Sentinel's announcements: from the moment the Sentinel leading a failover of
//! this master says it promotes a replica until the new master is announced (at
//! most [`SWITCH_HOLD`]), commands wait, then go to the new master, so that
//! nothing is written to the old one after the promotion, where it would be
//! discarded when Sentinel makes it a replica (`sentinel.rs`, `announcements.rs`).
//! With `redis.tls_server_name` every connection is dialed by [`super::dial`]
//! instead of the redis crate. On Redis Cluster (`redis.mode = "cluster"`) it is
//! the redis crate's cluster connection, which follows MOVED and ASK redirections,
//! retries TRYAGAIN and reconnects by itself; pub/sub goes to a seed node (a PUBLISH
//! reaches every node) (`cluster.rs`).

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

mod announcements;
mod cluster;
mod sentinel;
mod separate;

pub(super) use super::tls::node_client;
use announcements::listen;
use cluster::Cluster;
pub use cluster::slot_master;
pub use sentinel::SentinelConfig;
use sentinel::{Follow, RESOLVE_EVERY, SWITCH_HOLD, sentinel_client, sentinel_clients};
pub use separate::Separate;
pub(in crate::store) use separate::master_moved;

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

impl Current {
    /// Whether its node is the one at `address` (as [`shown`] writes it).
    fn reaches(&self, address: &str) -> bool {
        shown(self.client.get_connection_info().addr()) == address
    }
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

    /// Whether this is a Redis Cluster connection.
    pub(super) fn is_cluster(&self) -> bool {
        self.cluster.is_some()
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
        let (client, dialer, _) = self.node();
        match dialer {
            Some(dialer) => dialer.pubsub().await,
            None => client.get_async_pubsub().await,
        }
    }

    /// A multiplexed connection to the current node, apart from this one.
    pub(super) async fn separate(
        &self,
        config: &redis::AsyncConnectionConfig,
    ) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        Ok(self.separate_at(config).await?.0)
    }

    /// [`Conn::separate`], and the master's generation of the node it reaches: read
    /// with the node's address, so that a master that moves while it is made never
    /// leaves it counted older than the node it reaches (a command under way there
    /// would be given up as if on the old master).
    pub(super) async fn separate_at(
        &self,
        config: &redis::AsyncConnectionConfig,
    ) -> redis::RedisResult<(redis::aio::MultiplexedConnection, u64)> {
        let (client, dialer, generation) = self.node();
        let conn = match dialer {
            Some(dialer) => dialer.multiplexed(config).await?,
            None => {
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await?
            }
        };
        Ok((conn, generation))
    }

    /// The current node: how to reach it, and the master's generation it is.
    fn node(&self) -> (redis::Client, Option<Arc<Dialer>>, u64) {
        let current = self.current.lock().expect("not poisoned");
        (
            current.client.clone(),
            current.dialer.clone(),
            current.generation,
        )
    }

    /// This connection, refusing every command once the master has moved from the
    /// one it reaches now: a leader's term works through one, so that none of its
    /// writes reaches a new master (whose fences may have gone back with the writes
    /// a failover lost) before a new term has raised them there.
    pub(super) fn pinned(&self) -> Conn {
        Conn {
            pin: Some(self.generation()),
            ..self.clone()
        }
    }

    /// How many times the master has moved (0 on one Redis).
    fn generation(&self) -> u64 {
        self.current.lock().expect("not poisoned").generation
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
            // Not at the master yet: the next failed command asks again.
            let _ = self.follow(false).await;
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

fn timeout(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, what))
}
