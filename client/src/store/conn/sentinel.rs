//! Redis behind Sentinel: the master asked of the Sentinels, followed through a
//! failover (at most every [`RESOLVE_EVERY`]), and the Sentinels' announcements,
//! which hold commands while a failover is under way (see [`announcement`]).

use super::*;

/// Least time between two questions to the Sentinels.
pub(super) const RESOLVE_EVERY: Duration = Duration::from_millis(100);

/// Longest wait of a command while a Sentinel fails the master over: Sentinel
/// announces the new master once its poll of the promoted replica (every second
/// during a failover) sees it promoted, about a second after promoting it.
/// Past this, commands go on to the master this connection knows.
pub(in crate::store) const SWITCH_HOLD: Duration = Duration::from_secs(3);

pub(super) static NO_MASTER: crate::complaint::Complaint = crate::complaint::Complaint::new(
    "cannot find the Redis master through Sentinel",
    "Sentinel names the Redis master again",
);

pub(super) static NEW_MASTER_UNREACHED: crate::complaint::Complaint =
    crate::complaint::Complaint::new(
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

/// What following the master through Sentinel needs.
pub(super) struct Follow {
    /// The master's name.
    pub(super) master: String,
    pub(super) client: tokio::sync::Mutex<SentinelClient>,
    pub(super) manager_config: ConnectionManagerConfig,
    pub(super) connect_timeout: Duration,
    /// When the Sentinels were last asked.
    pub(super) asked: Mutex<Option<Instant>>,
    /// The master's address, each time it changes (a count of changes and the address).
    pub(super) changes: watch::Sender<(u64, String)>,
    /// A client of each Sentinel, for its announcements.
    pub(super) sentinels: Vec<redis::Client>,
    /// How to reach a data node (user, password, database, TLS) at an address
    /// a Sentinel announces.
    pub(super) data: redis::ConnectionInfo,
    pub(super) tls: Option<RedisTls>,
    /// The Sentinels (by index into `sentinels`) that announced a failover of
    /// the master under way, and since when: commands wait meanwhile.
    pub(super) switching: watch::Sender<BTreeMap<usize, Instant>>,
}

impl Follow {
    /// Waits while a Sentinel fails the master over (see [`SWITCH_HOLD`]).
    pub(super) async fn hold(&self) {
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

/// The connection behind weak references, while anybody still uses it.
pub(super) fn upgrade(current: &Weak<Mutex<Current>>, follow: &Weak<Follow>) -> Option<Conn> {
    Some(Conn {
        current: current.upgrade()?,
        sentinel: Some(follow.upgrade()?),
        cluster: None,
        pin: None,
    })
}

/// The Sentinel client: the data URL gives the data nodes' user, password,
/// database and TLS; `sentinel` the Sentinels' own.
pub(super) fn sentinel_client(
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
pub(super) fn sentinel_clients(
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

impl Conn {
    /// `SENTINEL <subcommand> <master>`, asked of the first Sentinel that answers.
    pub(super) async fn ask_sentinel<T: redis::FromRedisValue>(
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
    pub(in crate::store) async fn sentinel_failover(&self) -> redis::RedisResult<()> {
        self.ask_sentinel("FAILOVER").await
    }

    /// Whether every replica the Sentinels know of the master (`SENTINEL
    /// REPLICAS`) says it is a replica of the master this connection follows,
    /// with its link up (asked directly: Sentinel polls replicas every 10 s).
    /// After a planned failover the old master goes on as a master until
    /// Sentinel makes it a replica; a second failover before that can promote it
    /// with what it had, and what the new master took meanwhile is discarded.
    pub(in crate::store) async fn replicas_in_sync(&self) -> redis::RedisResult<bool> {
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
            let field = |name: &str| crate::store::info_value(&info, name);
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

    /// Asks the Sentinels for the master (`anyway`: even if asked just now) and
    /// moves to it if it is another node; whether this connection is at the master
    /// they named (false too when not asked, or when no answer came).
    pub(super) async fn follow(&self, anyway: bool) -> bool {
        let Some(follow) = &self.sentinel else {
            return true;
        };
        {
            let mut asked = follow.asked.lock().expect("not poisoned");
            if !anyway && asked.is_some_and(|at| at.elapsed() < RESOLVE_EVERY) {
                return false;
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
                return false;
            }
            Err(_) => {
                if let Some(said) = NO_MASTER.failed() {
                    tracing::warn!(error = %"no Sentinel named a master in time", "{said}");
                }
                return false;
            }
        };
        drop(sentinel);
        self.move_to(follow, client).await
    }

    /// Moves to the master a Sentinel announced at `host:port` (asking the
    /// Sentinels again could reach one that has not heard of the switch yet);
    /// whether this connection is there.
    pub(super) async fn follow_to(&self, host: &str, port: u16) -> bool {
        let Some(follow) = &self.sentinel else {
            return true;
        };
        match node_client(&follow.data, follow.tls.as_ref(), host, port) {
            Ok((_, client)) => self.move_to(follow, client).await,
            Err(e) => {
                tracing::warn!(error = %e, host, port, "cannot reach the announced Redis master");
                false
            }
        }
    }

    /// Whether this connection's commands go to the node at `address` now.
    fn reaches(&self, address: &str) -> bool {
        self.current.lock().expect("not poisoned").reaches(address)
    }

    /// Moves every later command to the master `client` reaches, if it is another
    /// node; whether this connection is at that master now (false: it could not
    /// move there, and stays where it was).
    pub(super) async fn move_to(&self, follow: &Follow, client: redis::Client) -> bool {
        let address = shown(client.get_connection_info().addr());
        if self.reaches(&address) {
            return true;
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
                return false;
            }
            Err(_) => {
                if let Some(said) = NEW_MASTER_UNREACHED.failed() {
                    tracing::warn!(error = %"no answer in time", %address, "{said}");
                }
                return false;
            }
        };
        #[cfg(feature = "faults")]
        tokio::time::sleep(crate::store::faults::master_moves_slowed_by()).await;
        // Never to a replica: only a node that says it is a master (in its HELLO
        // reply, which a least-privilege user may ask for, unlike ROLE).
        match master::says_master(&mut manager, follow.connect_timeout).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(%address, "not moving to a node that does not say it is a master");
                return false;
            }
            Err(e) if e.code() == Some("NOPERM") => {
                tracing::warn!(error = %e, %address, "cannot follow the Redis master: the Redis user may not run HELLO (see docs/redis-rights.md)");
                return false;
            }
            Err(e) => {
                tracing::debug!(error = %e, %address, "not moving to a node that did not say what it is");
                return false;
            }
        }
        {
            let mut current = self.current.lock().expect("not poisoned");
            // Each Sentinel announces the switch, and their announcements are
            // followed side by side: the first to get here moves the connection, the
            // others find it there (asked again under the lock that moves it). A
            // second move to the same master would count a new generation, ending
            // the term pinned to the first and giving up the reads under way there
            // as if on the old master.
            if current.reaches(&address) {
                return true;
            }
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
        true
    }

    /// Follows every Sentinel's announcements while this connection is in use:
    /// a failover is followed when announced, not only when a command fails on
    /// the old master (which, demoted in a planned failover, may go on taking
    /// writes for a while), and commands wait while one is under way.
    pub(super) fn watch_announcements(&self) {
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
