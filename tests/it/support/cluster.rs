//! `delayq run` processes elected through etcd, sharing one Redis; and who leads
//! among any set of nodes, asked over HTTP as a load balancer would (`/leader`
//! answers 200 on the leader only).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use delayq_client::config::Config;
use delayq_client::store::Store;
use delayq_harness::{DelayqProcess, EtcdServer, RedisServer};

use super::{Api, delayq_bin, toml_layers, within};

/// The epoch a node leads under and its id, when it says it leads; None for a
/// standby and for a node that does not answer.
async fn leading(node: &Api) -> Option<(u64, String)> {
    let (status, body) = node.try_get("/leader").await?;
    if status != 200 {
        return None;
    }
    Some((
        body["epoch"].as_u64()?,
        body["node_id"].as_str()?.to_owned(),
    ))
}

/// The epoch `node` leads under, if it says it leads.
pub async fn leads(node: &Api) -> Option<u64> {
    Some(leading(node).await?.0)
}

/// The election groups `node` leads (`election.mode = "per_shard"`), each with
/// its epoch of the group; None when it does not answer.
pub async fn led_groups(node: &Api) -> Option<Vec<(usize, u64)>> {
    let (status, view) = node.try_get("/v1/leader").await?;
    (status == 200).then_some(())?;
    Some(
        view["groups"]
            .as_array()?
            .iter()
            .filter(|g| g["is_leader"] == true)
            .filter_map(|g| Some((g["group"].as_u64()? as usize, g["epoch"].as_u64()?)))
            .collect(),
    )
}

/// Which of `nodes` say they lead, with their epochs; those in `except` (stopped,
/// say) are not asked.
pub async fn leaders(nodes: &[Api], except: &[usize]) -> Vec<(usize, u64)> {
    let asked: Vec<usize> = (0..nodes.len()).filter(|i| !except.contains(i)).collect();
    let answers = futures::future::join_all(asked.iter().map(|&i| leads(&nodes[i]))).await;
    asked
        .into_iter()
        .zip(answers)
        .filter_map(|(i, e)| Some((i, e?)))
        .collect()
}

/// A wait for exactly one leader among some nodes: the one way tests wait for an
/// election, a takeover or a handover.
pub struct OneLeader<'a> {
    nodes: &'a [Api],
    except: &'a [usize],
    above: u64,
    agreed: bool,
    timeout: Duration,
}

impl<'a> OneLeader<'a> {
    /// Any one of `nodes`, within 10 s (× patience).
    pub fn among(nodes: &'a [Api]) -> OneLeader<'a> {
        OneLeader {
            nodes,
            except: &[],
            above: 0,
            agreed: false,
            timeout: Duration::from_secs(10),
        }
    }

    /// Neither counts nor asks these nodes (stopped ones, or the old leader).
    pub fn except(mut self, except: &'a [usize]) -> Self {
        self.except = except;
        self
    }

    /// Only a leader whose epoch is above `epoch`: a new term.
    pub fn above(mut self, epoch: u64) -> Self {
        self.above = epoch;
        self
    }

    /// Also every other node that answers names it as the leader (`/v1/leader`).
    pub fn agreed(mut self) -> Self {
        self.agreed = true;
        self
    }

    pub fn within(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The leader and its epoch, or a panic naming who led when time ran out, and
    /// `context` (the nodes' logs, say).
    pub async fn wait(self, context: impl Fn() -> String) -> (usize, u64) {
        let seen = RefCell::new(Vec::new());
        let found = within(self.timeout, || async {
            let found = self.once().await;
            *seen.borrow_mut() = found.1;
            found.0
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "no single leader{} (not asking {:?}) within {:?}; last seen leading: {:?}\n{}",
                if self.above > 0 {
                    format!(" above epoch {}", self.above)
                } else {
                    String::new()
                },
                self.except,
                self.timeout * super::patience(),
                seen.borrow(),
                context()
            )
        })
    }

    /// One look: the leader if it is the one wanted (None: not now).
    pub async fn now(&self) -> Option<(usize, u64)> {
        self.once().await.0
    }

    /// One look: the leader if it is the one wanted, and who said they lead.
    async fn once(&self) -> (Option<(usize, u64)>, Vec<(usize, u64, String)>) {
        let asked: Vec<usize> = (0..self.nodes.len())
            .filter(|i| !self.except.contains(i))
            .collect();
        let answers =
            futures::future::join_all(asked.iter().map(|&i| leading(&self.nodes[i]))).await;
        let seen: Vec<(usize, u64, String)> = asked
            .iter()
            .zip(answers)
            .filter_map(|(&i, a)| a.map(|(epoch, id)| (i, epoch, id)))
            .collect();
        let [(node, epoch, id)] = seen.as_slice() else {
            return (None, seen);
        };
        if *epoch <= self.above || (self.agreed && !self.all_name(&asked, id).await) {
            return (None, seen);
        }
        (Some((*node, *epoch)), seen)
    }

    /// Whether every asked node that answers `/v1/leader` names `id` as the leader.
    async fn all_name(&self, asked: &[usize], id: &str) -> bool {
        let views =
            futures::future::join_all(asked.iter().map(|&i| self.nodes[i].try_get("/v1/leader")))
                .await;
        views
            .into_iter()
            .flatten()
            .all(|(status, view)| status == 200 && view["leader"]["node_id"] == id)
    }
}

/// The config text of a node on the Redis at `redis_url` and the etcd members at
/// `endpoints` (2 shards, a 2 s lease), with `extra` (TOML) merged over it.
pub fn etcd_config(redis_url: &str, endpoints: &[String], extra: &str) -> String {
    let endpoints: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    let base = format!(
        "[redis]\nurl = \"{redis_url}\"\nshards = 2\n[etcd]\nendpoints = [{}]\nlease_ttl = \"2s\"\n",
        endpoints.join(", ")
    );
    toml_layers(&[&base, extra])
}

/// One Redis, etcd (one member or a cluster of them), and `delayq run` processes
/// `n0`, `n1`, ... sharing them, each with its `Api`.
pub struct Cluster {
    pub redis: RedisServer,
    pub etcd: Vec<EtcdServer>,
    pub nodes: Vec<DelayqProcess>,
    /// Node `i`'s API, with a short timeout: a node that hangs must not hold up a
    /// test asking who leads.
    pub apis: Vec<Api>,
    /// A store on the Redis, for producers that do not go through a node.
    pub store: Store,
    /// The settings every node was started with (besides Redis and etcd).
    extra: String,
}

impl Cluster {
    /// `nodes` nodes on `etcd_members` etcd members, each node configured by
    /// `etcd_config` with `extra`. Node 0 starts first and is the first leader.
    pub async fn start(nodes: usize, etcd_members: usize, extra: &str) -> Cluster {
        Self::start_with(nodes, etcd_members, extra, |_| (0..etcd_members).collect()).await
    }

    /// `start`, node `i` given the etcd members `members_of(i)` only.
    pub async fn start_with(
        nodes: usize,
        etcd_members: usize,
        extra: &str,
        members_of: impl Fn(usize) -> Vec<usize>,
    ) -> Cluster {
        Self::launch(nodes, etcd_members, extra, members_of, |_, url| {
            url.to_owned()
        })
        .await
    }

    /// `start`, node `i` reaching Redis at `redis_url_of(i, the Redis URL)` (a proxy
    /// in front of it, say).
    pub async fn start_via(
        nodes: usize,
        etcd_members: usize,
        extra: &str,
        redis_url_of: impl Fn(usize, &str) -> String,
    ) -> Cluster {
        let all = move |_| (0..etcd_members).collect();
        Self::launch(nodes, etcd_members, extra, all, redis_url_of).await
    }

    async fn launch(
        nodes: usize,
        etcd_members: usize,
        extra: &str,
        members_of: impl Fn(usize) -> Vec<usize>,
        redis_url_of: impl Fn(usize, &str) -> String,
    ) -> Cluster {
        super::panics::install();
        let redis = RedisServer::start().expect("start redis-server");
        let etcd = EtcdServer::cluster(etcd_members).expect("start etcd");
        let configs: Vec<String> = (0..nodes)
            .map(|i| {
                let endpoints: Vec<String> = members_of(i)
                    .into_iter()
                    .map(|m| etcd[m].endpoint())
                    .collect();
                etcd_config(&redis_url_of(i, &redis.url()), &endpoints, extra)
            })
            .collect();
        let start = |i: usize| {
            let node = DelayqProcess::start(&delayq_bin(), &format!("n{i}"), &configs[i])
                .expect("start delayq");
            let api = Api::new(node.api).with_timeout(Duration::from_secs(2));
            (node, api)
        };
        let (first, api) = start(0);
        // The nodes' own settings, so that the test's pushes land in their shards, on
        // Redis itself (a node may reach it through a proxy the test cuts).
        let endpoints: Vec<String> = etcd.iter().map(|m| m.endpoint()).collect();
        let own = etcd_config(&redis.url(), &endpoints, extra);
        let own = Config::from_toml(&own, std::iter::empty()).expect("node config");
        let store = Store::connect(&own.store_config())
            .await
            .expect("connect to redis");
        let mut cluster = Cluster {
            redis,
            etcd,
            nodes: vec![first],
            apis: vec![api],
            store,
            extra: extra.to_owned(),
        };
        cluster.one_leader().wait(|| cluster.logs()).await;
        for i in 1..nodes {
            let (node, api) = start(i);
            cluster.nodes.push(node);
            cluster.apis.push(api);
        }
        cluster
    }

    /// Starts one node more, `n<i>` (returned), configured as the first ones, on
    /// every etcd member.
    pub fn join(&mut self) -> usize {
        let i = self.nodes.len();
        let endpoints: Vec<String> = self.etcd.iter().map(|m| m.endpoint()).collect();
        let config = etcd_config(&self.redis.url(), &endpoints, &self.extra);
        let node =
            DelayqProcess::start(&delayq_bin(), &format!("n{i}"), &config).expect("start delayq");
        self.apis
            .push(Api::new(node.api).with_timeout(Duration::from_secs(2)));
        self.nodes.push(node);
        i
    }

    /// A wait for one leader among the nodes.
    pub fn one_leader(&self) -> OneLeader<'_> {
        OneLeader::among(&self.apis)
    }

    /// Which nodes say they lead, with their epochs.
    pub async fn leaders(&self) -> Vec<(usize, u64)> {
        leaders(&self.apis, &[]).await
    }

    /// The end of every node's log, for failure messages.
    pub fn logs(&self) -> String {
        logs_of(&self.nodes)
    }
}

/// The end of each of `nodes`' logs, for failure messages.
pub fn logs_of(nodes: &[DelayqProcess]) -> String {
    nodes
        .iter()
        .map(|n| format!("--- {} ---\n{}", n.name, n.log()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every node's whole log between `from` and `until` (by each line's timestamp), for a
/// phase that went wrong long before a test's end: its last lines no longer cover it.
pub fn logs_between(
    nodes: &[DelayqProcess],
    from: std::time::SystemTime,
    until: std::time::SystemTime,
) -> String {
    // The daemon stamps its lines in RFC 3339 with microseconds, which sort as text.
    let (from, until) = (
        humantime::format_rfc3339_micros(from).to_string(),
        humantime::format_rfc3339_micros(until).to_string(),
    );
    nodes
        .iter()
        .map(|n| {
            let log = n.full_log();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| {
                    l.get(..from.len())
                        .is_some_and(|t| t >= &*from && t <= &*until)
                })
                .collect();
            format!("--- {} ---\n{}", n.name, lines.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// SIGKILLs `nodes[leader]`, which leads under `epoch`, and waits (15 s at most)
/// for another node to lead under a newer epoch: that node, and how long after
/// the kill it led.
pub async fn kill_and_time_takeover(
    nodes: &mut [DelayqProcess],
    apis: &[Api],
    (leader, epoch): (usize, u64),
) -> (usize, Duration) {
    let killed_at = Instant::now();
    nodes[leader].kill();
    let (next, _) = OneLeader::among(apis)
        .except(&[leader])
        .above(epoch)
        .within(Duration::from_secs(15))
        .wait(|| logs_of(nodes))
        .await;
    (next, killed_at.elapsed())
}
