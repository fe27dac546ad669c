//! A Redis Cluster of real redis-server processes: masters with replicas, slots
//! assigned, resharded and failed over on request.

use super::*;

/// A Redis Cluster of our own on loopback: masters with one replica each, joined
/// by `redis-cli --cluster create`; every node is stopped on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `masters` masters (at least 3) and as many replicas, every slot covered.
    pub fn start(masters: usize) -> anyhow::Result<Self> {
        Self::start_with(masters, None)
    }

    /// [`RedisCluster::start`], with `tls`: every node also serves TLS (its
    /// `tls_port`), and the cluster bus and replication run over TLS; clients
    /// that connect over TLS are told the nodes' TLS ports.
    pub fn start_with(masters: usize, tls: Option<RedisTlsFiles>) -> anyhow::Result<Self> {
        let nodes = (0..masters * 2)
            .map(|_| {
                RedisServer::start_with(RedisOptions {
                    cluster: true,
                    tls: tls.clone(),
                    ..RedisOptions::default()
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut create = Command::new(binary("DELAYQ_TEST_REDIS_CLI", "redis-cli"));
        create.args(["--cluster", "create"]);
        match &tls {
            Some(files) => {
                create.args(
                    nodes
                        .iter()
                        .map(|n| format!("127.0.0.1:{}", n.tls_port.unwrap_or(n.port))),
                );
                create
                    .arg("--tls")
                    .arg("--cacert")
                    .arg(&files.ca)
                    .arg("--cert")
                    .arg(&files.cert)
                    .arg("--key")
                    .arg(&files.key);
            }
            None => {
                create.args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
            }
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .context("run redis-cli --cluster create (is redis-tools installed?)")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.is_ok() {
            if Instant::now() > deadline {
                bail!("the Redis Cluster did not reach cluster_state:ok within 30s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(cluster)
    }

    /// Whether every node says `cluster_state:ok` and knows every other node, and
    /// every replica has synced with its master.
    fn is_ok(&self) -> bool {
        self.nodes.iter().all(|n| {
            let connected = redis::Client::open(n.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)));
            let Ok(mut c) = connected else {
                return false;
            };
            let cluster = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c);
            let replication = redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut c);
            cluster.is_ok_and(|i| {
                i.contains("cluster_state:ok")
                    && i.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
            }) && replication
                .is_ok_and(|r| r.contains("role:master") || r.contains("master_link_status:up"))
        })
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A connection to the first node still running.
    fn any_live(&self) -> anyhow::Result<redis::Connection> {
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let connected = redis::Client::open(node.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)));
            if let Ok(conn) = connected {
                return Ok(conn);
            }
        }
        bail!("no node of the Redis Cluster answers")
    }

    /// The `[redis]` settings (without the header) of a daemon on this cluster:
    /// `redis.mode = "cluster"`, the first node as the URL and the others as seeds.
    pub fn redis_section(&self) -> String {
        let urls = self.urls();
        let seeds: Vec<String> = urls[1..]
            .iter()
            .map(|u| format!("\"{}\"", u.trim_start_matches("redis://")))
            .collect();
        format!(
            "mode = \"cluster\"\nurl = \"{}\"\nnodes = [{}]\n",
            urls[0],
            seeds.join(", ")
        )
    }

    /// Which node (index into `nodes`) serves `slot` as master now.
    pub fn master_of(&self, slot: u16) -> anyhow::Result<usize> {
        let mut conn = self.any_live()?;
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut conn)?;
        let port = serving_master(&nodes, slot)
            .with_context(|| format!("no master serves slot {slot}"))?;
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .context("CLUSTER SLOTS names a node not ours")
    }

    /// Whether node `i` runs and is a master now.
    pub fn master_of_node(&self, i: usize) -> bool {
        if self.nodes[i].child.is_none() {
            return false;
        }
        let role: redis::RedisResult<Vec<redis::Value>> =
            redis::cmd("ROLE").query(&mut self.nodes[i].client());
        role.ok()
            .and_then(|r| redis::from_redis_value::<String>(r.first()?.clone()).ok())
            .is_some_and(|r| r == "master")
    }

    /// SIGKILLs node `i` and waits (up to 30 s) until another node serves as
    /// master every slot it served: its replica's promotion. When it was killed.
    pub fn kill_master(&mut self, i: usize) -> anyhow::Result<std::time::SystemTime> {
        let slots: Vec<u16> = (0..16384u16)
            .step_by(64)
            .filter(|&s| self.master_of(s).ok() == Some(i))
            .collect();
        self.nodes[i].kill();
        let killed = std::time::SystemTime::now();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let moved = slots
                .iter()
                .all(|&s| self.master_of(s).is_ok_and(|m| m != i));
            if moved {
                return Ok(killed);
            }
            if Instant::now() > deadline {
                bail!("no replica took over node {i}'s slots within 30s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Moves `slot` to node `to` (a master) as `redis-cli --cluster reshard` does,
    /// key by key: IMPORTING and MIGRATING, then `MIGRATE` of `batch` keys at a
    /// time with `pause` between (clients meanwhile get ASK and TRYAGAIN), then the
    /// slot's new owner announced to every master.
    /// Node `i`'s id in the cluster (`CLUSTER MYID`).
    fn node_id(&self, i: usize) -> anyhow::Result<String> {
        Ok(redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.nodes[i].client())?)
    }

    /// Moves `slots` hash slots from node `from` to node `to` (both masters) as an
    /// operator does: `redis-cli --cluster reshard`, which migrates the keys of
    /// each slot in turn while clients go on (ASK, TRYAGAIN meanwhile).
    pub fn reshard(&self, from: usize, to: usize, slots: usize) -> anyhow::Result<()> {
        let out = Command::new(binary("DELAYQ_TEST_REDIS_CLI", "redis-cli"))
            .args(["--cluster", "reshard"])
            .arg(format!("127.0.0.1:{}", self.nodes[from].port))
            .arg("--cluster-from")
            .arg(self.node_id(from)?)
            .arg("--cluster-to")
            .arg(self.node_id(to)?)
            .arg("--cluster-slots")
            .arg(slots.to_string())
            .args(["--cluster-yes", "--cluster-pipeline", "100"])
            .stdin(Stdio::null())
            .output()
            .context("run redis-cli --cluster reshard")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster reshard failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    pub fn move_slot(
        &self,
        slot: u16,
        to: usize,
        batch: usize,
        pause: Duration,
    ) -> anyhow::Result<()> {
        let from = self.master_of(slot)?;
        if from == to {
            return Ok(());
        }
        let (from_id, to_id) = (self.node_id(from)?, self.node_id(to)?);
        let mut source = self.nodes[from].client();
        let mut target = self.nodes[to].client();
        let () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("IMPORTING")
            .arg(&from_id)
            .query(&mut target)?;
        let () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("MIGRATING")
            .arg(&to_id)
            .query(&mut source)?;
        loop {
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(batch)
                .query(&mut source)?;
            if keys.is_empty() {
                break;
            }
            let () = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.nodes[to].port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut source)?;
            std::thread::sleep(pause);
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].child.is_none() {
                continue;
            }
            let mut conn = self.nodes[i].client();
            let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut conn)?;
            if redis::from_redis_value::<String>(role[0].clone())? == "master" {
                let () = redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("NODE")
                    .arg(&to_id)
                    .query(&mut conn)?;
            }
        }
        Ok(())
    }
}

/// The port of the master that `CLUSTER NODES` (one line a node: id, address,
/// flags, master, ping, pong, epoch, link, then its slots and ranges) says
/// serves `slot`; slots being moved (`[…]`) are skipped.
fn serving_master(nodes: &str, slot: u16) -> Option<u16> {
    nodes.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let flags = words.get(2)?;
        let flags: Vec<&str> = flags.split(',').collect();
        if !flags.contains(&"master") || flags.contains(&"fail") {
            return None;
        }
        let serves = words.iter().skip(8).any(|range| {
            let (low, high) = range.split_once('-').unwrap_or((range, range));
            matches!((low.parse::<u16>(), high.parse::<u16>()), (Ok(l), Ok(h)) if (l..=h).contains(&slot))
        });
        let address = words.get(1)?.split('@').next()?;
        serves.then(|| address.rsplit_once(':')?.1.parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::serving_master;

    const NODES: &str = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7002@17002 master - 0 1 2 connected 5461-10922 [5462->-c3]
c3 127.0.0.1:7003@17003 master,fail - 0 1 3 disconnected 10923-16383
d4 127.0.0.1:7004@17004 slave a1 0 1 1 connected
e5 127.0.0.1:7005@17005 master - 0 1 5 connected 16000
";

    #[test]
    fn the_master_serving_a_slot_is_read_from_cluster_nodes() {
        for (slot, want) in [
            (0, Some(7001)),
            (5460, Some(7001)),
            (5461, Some(7002)),
            (5462, Some(7002)),
            (10922, Some(7002)),
            (12000, None),
            (16000, Some(7005)),
        ] {
            assert_eq!(serving_master(NODES, slot), want, "slot {slot}");
        }
    }
}
