//! Redis Cluster (`redis.mode = "cluster"`): the redis crate's cluster connection,
//! which follows MOVED and ASK redirections, retries TRYAGAIN and reconnects by
//! itself, made anew from the seeds when a call runs out of time; commands on a
//! slot's master, on every master, on one node; pub/sub to a seed or a slot's master.

use super::*;

// What finding Redis again logs while it fails (asked for on every failed command,
// at most every RESOLVE_EVERY): one line per condition (see `complaint`).
pub(super) static CLUSTER_UNREACHED: crate::complaint::Complaint = crate::complaint::Complaint::new(
    "cannot reach the Redis Cluster",
    "the Redis Cluster is reached again",
);

/// What a Redis Cluster connection needs: the client (its seeds and settings)
/// and the seeds' plain clients, for pub/sub.
pub(super) struct Cluster {
    pub(super) client: ClusterClient,
    pub(super) seeds: Vec<redis::Client>,
    /// The seeds' scheme, user, password and TLS settings, for a client of any
    /// node (see [`node_client`]): presence's pub/sub (the daemon's).
    pub(super) info: redis::ConnectionInfo,
    pub(super) tls: Option<RedisTls>,
    pub(super) response_timeout: Duration,
    pub(super) connect_timeout: Duration,
    /// When the connection was last made anew (see [`Conn::reconnect_cluster`]).
    pub(super) renewed: tokio::sync::Mutex<Option<Instant>>,
}

/// The cluster connection's settings: `response_timeout` per command (the redis
/// crate's default would be 500 ms).
pub(super) fn cluster_config(response_timeout: Duration) -> ClusterConfig {
    ClusterConfig::new().set_response_timeout(response_timeout)
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

impl Conn {
    /// Connects to Redis Cluster through `seeds` (host, port), with the URL's
    /// scheme, user, password and TLS settings.
    pub(super) async fn connect_cluster(
        config: &StoreConfig,
        seeds: &[(String, u16)],
    ) -> Result<Conn> {
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
    pub(in crate::store) async fn on_master_of(
        &self,
        slot: u16,
        cmd: Cmd,
    ) -> redis::RedisResult<Value> {
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
    pub(in crate::store) async fn on_every_master(
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
    pub(in crate::store) async fn on_node(
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

    /// A pub/sub connection to the node that commands on `slot`'s keys reach: the
    /// master of `slot` on Redis Cluster (as that master itself says: see
    /// [`Conn::master_address`]), with its address; the current node otherwise (no
    /// address: it follows the node).
    pub(in crate::store) async fn pubsub_on_master_of(
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
    pub(in crate::store) async fn master_address(
        &self,
        slot: u16,
    ) -> redis::RedisResult<Option<(String, u16)>> {
        let slots = self
            .on_master_of(slot, redis::cmd("CLUSTER").arg("SLOTS").clone())
            .await?;
        Ok(slot_master(&slots, slot))
    }

    /// Replaces the cluster connection with a new one, which learns the cluster's
    /// shape afresh from the seeds, at most every [`RESOLVE_EVERY`] × 5. After a
    /// master died, the redis crate's connection went on waiting for it (every
    /// command timing out, whichever node it was for) well after its replica took
    /// over; a new connection routes to the promoted replica at once.
    pub(super) async fn reconnect_cluster(&self) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
