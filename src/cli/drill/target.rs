//! The cluster a drill exercises: one it started itself (real processes from
//! [`delayq_harness`]) or an existing one reached through its nodes' APIs and
//! operator commands (`docker kill {node}`, `systemctl kill -s SIGSTOP ...`).

use delayq_client::client::ProducerOptions;
use delayq_client::secret::RedisUrl;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};

use delayq_client::store::SentinelConfig;
use delayq_harness::{
    DelayqProcess, EtcdServer, Proxy, RedisCluster, RedisServer, SentinelOptions, SentinelSet,
};

/// A delayq node: its name (what `{node}` stands for) and API base URL.
#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub url: String,
}

/// Operator commands for an existing cluster; `{node}` and `{member}` are
/// replaced by names, and each runs through `sh -c`.
#[derive(Clone, Debug, Default)]
pub struct Commands {
    pub kill: Option<String>,
    pub term: Option<String>,
    pub start: Option<String>,
    pub pause: Option<String>,
    pub resume: Option<String>,
    pub etcd_kill: Option<String>,
    pub etcd_start: Option<String>,
    pub redis_cut: Option<String>,
    pub redis_restore: Option<String>,
}

/// A cluster started by the drill: everything on loopback, gone when dropped.
/// On one Redis each node reaches it through a proxy of its own, which can cut it
/// off; on a Redis Cluster the nodes reach every master directly (no proxies).
pub struct Local {
    pub redis: LocalRedis,
    pub etcd: Vec<EtcdServer>,
    pub nodes: Vec<DelayqProcess>,
    pub proxies: Vec<Proxy>,
    /// The nodes' `redis.shards`, which the drill's own pushes must use too.
    pub shards: u16,
}

/// Why a local drill on a Redis Cluster or behind Sentinel cannot cut a node off
/// from Redis.
pub const NO_CUT_ON_CLUSTER: &str = "a single Redis (on the local Redis Cluster or behind Sentinel the nodes reach the masters directly)";

/// What the Redis failover scenario needs.
pub const NEEDS_SENTINEL: &str = "Redis behind Sentinel (--redis-sentinel, or --config with redis.sentinel for an existing cluster)";

/// The master's name for the Sentinels of a local drill.
const SENTINEL_MASTER: &str = "drill-master";

/// The Redis a local drill started.
pub enum LocalRedis {
    Single(RedisServer),
    /// Three masters and three replicas (`--redis-cluster`).
    Cluster(RedisCluster),
    /// A master, two replicas and three Sentinels (`--redis-sentinel`).
    Sentinel(SentinelSet),
}

/// An existing cluster.
pub struct Remote {
    pub nodes: Vec<Node>,
    /// How to reach the nodes' Redis (a URL, or their configuration: TLS, an ACL
    /// user, Sentinel).
    pub redis: ProducerOptions,
    pub etcd_members: Vec<String>,
    pub commands: Commands,
}

pub enum Target {
    Local(Box<Local>),
    Remote(Box<Remote>),
}

/// Settings of a cluster the drill starts.
pub struct LocalSpec<'a> {
    pub bin: &'a Path,
    pub nodes: usize,
    pub etcd_members: usize,
    pub lease_ttl: Duration,
    pub shards: u16,
    /// A Redis Cluster instead of one redis-server.
    pub redis_cluster: bool,
    /// A master with two replicas behind Sentinel instead of one redis-server.
    pub redis_sentinel: bool,
}

impl Target {
    /// Starts redis-server (or a Redis Cluster), an etcd cluster and `nodes`
    /// delayq processes. The first node starts alone, so it is the first leader.
    pub fn start_local(spec: &LocalSpec) -> anyhow::Result<Target> {
        let redis = if spec.redis_cluster {
            LocalRedis::Cluster(RedisCluster::start(3).context("start a Redis Cluster")?)
        } else if spec.redis_sentinel {
            let set = SentinelSet::start(SENTINEL_MASTER, 2, None, &SentinelOptions::default())
                .context("start Redis behind Sentinel")?;
            set.wait_ready(Duration::from_secs(30))?;
            LocalRedis::Sentinel(set)
        } else {
            LocalRedis::Single(RedisServer::start().context("start redis-server")?)
        };
        let etcd = EtcdServer::cluster(spec.etcd_members).context("start etcd")?;
        let endpoints: Vec<String> = etcd
            .iter()
            .map(|m| format!("\"{}\"", m.endpoint()))
            .collect();
        let config = |redis_section: &str| {
            format!(
                "[redis]\n{redis_section}\n[etcd]\nendpoints = [{}]\ncluster = \"drill\"\nlease_ttl = \"{}s\"\n\n[log]\nlevel = \"info\"\n",
                endpoints.join(", "),
                spec.lease_ttl.as_secs().max(2),
            )
        };
        let mut nodes = Vec::with_capacity(spec.nodes);
        let mut proxies = Vec::with_capacity(spec.nodes);
        for i in 0..spec.nodes {
            let name = format!("node-{}", i + 1);
            let section = match &redis {
                LocalRedis::Single(redis) => {
                    let proxy = tokio::runtime::Handle::current().block_on(Proxy::start());
                    proxy.lead_to(&redis.url());
                    let section = format!(
                        "url = \"{}\"\nshards = {}\n",
                        proxy.redis_url(),
                        spec.shards
                    );
                    proxies.push(proxy);
                    section
                }
                LocalRedis::Cluster(cluster) => cluster.redis_section(),
                // A push is confirmed once every replica has it: whichever one a
                // failover promotes has it, so no confirmed push is lost. (With
                // fewer, a replica left following the old master can confirm a push
                // taken there after the promotion, which the switch then discards.)
                LocalRedis::Sentinel(set) => set.redis_section(&format!(
                    "shards = {}\nmin_replicas_acked = {}\n",
                    spec.shards,
                    set.replicas.len()
                )),
            };
            let node = DelayqProcess::start(spec.bin, &name, &config(&section))
                .with_context(|| format!("start delayq {name}"))?;
            nodes.push(node);
            if i == 0 {
                // Let the first one win, so the others line up behind it.
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        Ok(Target::Local(Box::new(Local {
            redis,
            etcd,
            nodes,
            proxies,
            shards: spec.shards,
        })))
    }

    pub fn nodes(&self) -> Vec<Node> {
        match self {
            Target::Local(l) => l
                .nodes
                .iter()
                .map(|n| Node {
                    name: n.name.clone(),
                    url: format!("http://{}", n.api),
                })
                .collect(),
            Target::Remote(r) => r.nodes.clone(),
        }
    }

    /// How the drill reaches the nodes' Redis.
    pub fn redis(&self) -> ProducerOptions {
        match self {
            Target::Local(l) => match &l.redis {
                LocalRedis::Single(redis) => ProducerOptions {
                    redis_url: RedisUrl::new(redis.url()),
                    shards: l.shards,
                    ..ProducerOptions::default()
                },
                LocalRedis::Cluster(cluster) => ProducerOptions {
                    redis_url: RedisUrl::new(cluster.urls()[0].clone()),
                    cluster: Some(
                        cluster
                            .nodes
                            .iter()
                            .map(|n| ("127.0.0.1".to_owned(), n.port))
                            .collect(),
                    ),
                    ..ProducerOptions::default()
                },
                LocalRedis::Sentinel(set) => ProducerOptions {
                    redis_url: RedisUrl::new(format!("redis://{}", set.name)),
                    shards: l.shards,
                    sentinel: Some(SentinelConfig {
                        master: set.name.clone(),
                        nodes: set
                            .sentinels
                            .iter()
                            .map(|s| ("127.0.0.1".to_owned(), s.port))
                            .collect(),
                        user: None,
                        password: None,
                        tls: false,
                    }),
                    ..ProducerOptions::default()
                },
            },
            Target::Remote(r) => r.redis.clone(),
        }
    }

    pub fn etcd_members(&self) -> Vec<String> {
        match self {
            Target::Local(l) => l.etcd.iter().map(|m| m.name.clone()).collect(),
            Target::Remote(r) => r.etcd_members.clone(),
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self, Target::Local(_))
    }

    /// Whether this target can run a fault; None if it can, else what is missing.
    pub fn missing_for(&self, fault: Fault) -> Option<&'static str> {
        let remote = match self {
            Target::Local(local) => {
                return match (fault, &local.redis) {
                    (Fault::RedisCut, LocalRedis::Cluster(_) | LocalRedis::Sentinel(_)) => {
                        Some(NO_CUT_ON_CLUSTER)
                    }
                    (Fault::RedisFailover, LocalRedis::Single(_) | LocalRedis::Cluster(_)) => {
                        Some(NEEDS_SENTINEL)
                    }
                    _ => None,
                };
            }
            Target::Remote(remote) => remote,
        };
        if fault == Fault::RedisFailover {
            return remote.redis.sentinel.is_none().then_some(NEEDS_SENTINEL);
        }
        let Remote {
            commands,
            etcd_members,
            ..
        } = &**remote;
        match fault {
            Fault::Kill if commands.kill.is_none() || commands.start.is_none() => {
                Some("--kill-cmd and --start-cmd")
            }
            Fault::Term if commands.term.is_none() || commands.start.is_none() => {
                Some("--term-cmd and --start-cmd")
            }
            Fault::Pause if commands.pause.is_none() || commands.resume.is_none() => {
                Some("--pause-cmd and --resume-cmd")
            }
            Fault::RedisCut if commands.redis_cut.is_none() || commands.redis_restore.is_none() => {
                Some("--redis-cut-cmd and --redis-restore-cmd")
            }
            Fault::EtcdLoss
                if etcd_members.is_empty()
                    || commands.etcd_kill.is_none()
                    || commands.etcd_start.is_none() =>
            {
                Some("--etcd-member, --etcd-kill-cmd and --etcd-start-cmd")
            }
            _ => None,
        }
    }

    /// Injects a fault into node `i` (or etcd member `i`). Returns once the
    /// action was taken (a SIGTERM is sent, not waited for: see [`Target::restore`]).
    pub async fn inject(&mut self, fault: Fault, i: usize) -> anyhow::Result<()> {
        match self {
            Target::Local(l) => {
                let l = &mut **l;
                tokio::task::block_in_place(|| match fault {
                    Fault::Kill => l.nodes[i].kill(),
                    Fault::Term => l.nodes[i].signal(libc::SIGTERM),
                    Fault::Pause => l.nodes[i].signal(libc::SIGSTOP),
                    Fault::EtcdLoss => l.etcd[i].kill(),
                    Fault::RedisCut => l.proxies[i].cut(),
                    Fault::Switchover | Fault::RedisFailover => {}
                });
                Ok(())
            }
            Target::Remote(remote) => {
                let Remote {
                    nodes,
                    etcd_members,
                    commands,
                    ..
                } = &**remote;
                let (template, name) = match fault {
                    Fault::Kill => (&commands.kill, &nodes[i].name),
                    Fault::Term => (&commands.term, &nodes[i].name),
                    Fault::Pause => (&commands.pause, &nodes[i].name),
                    Fault::RedisCut => (&commands.redis_cut, &nodes[i].name),
                    Fault::EtcdLoss => (&commands.etcd_kill, &etcd_members[i]),
                    Fault::Switchover | Fault::RedisFailover => return Ok(()),
                };
                let template = template.as_deref().context("no command for this fault")?;
                run_command(template, name).await
            }
        }
    }

    /// Undoes a fault: starts the node (or member) again, or resumes it. For a
    /// SIGTERM, first waits for the graceful exit (up to `stop_timeout`).
    pub async fn restore(
        &mut self,
        fault: Fault,
        i: usize,
        stop_timeout: Duration,
    ) -> anyhow::Result<()> {
        match self {
            Target::Local(l) => {
                let l = &mut **l;
                tokio::task::block_in_place(|| -> anyhow::Result<()> {
                    match fault {
                        Fault::Kill => l.nodes[i].restart(),
                        Fault::Term => {
                            let node = &mut l.nodes[i];
                            if node.wait_exit(stop_timeout).is_none() {
                                bail!(
                                    "{} did not exit within {stop_timeout:?} of SIGTERM",
                                    node.name
                                );
                            }
                            node.restart()
                        }
                        Fault::Pause => {
                            l.nodes[i].signal(libc::SIGCONT);
                            Ok(())
                        }
                        Fault::RedisCut => {
                            l.proxies[i].restore();
                            Ok(())
                        }
                        Fault::EtcdLoss => {
                            l.etcd[i].restart()?;
                            l.etcd[i].wait_ready()
                        }
                        Fault::Switchover | Fault::RedisFailover => Ok(()),
                    }
                })
            }
            Target::Remote(remote) => {
                let Remote {
                    nodes,
                    etcd_members,
                    commands,
                    ..
                } = &**remote;
                let (template, name) = match fault {
                    Fault::Kill | Fault::Term => (&commands.start, &nodes[i].name),
                    Fault::Pause => (&commands.resume, &nodes[i].name),
                    Fault::RedisCut => (&commands.redis_restore, &nodes[i].name),
                    Fault::EtcdLoss => (&commands.etcd_start, &etcd_members[i]),
                    Fault::Switchover | Fault::RedisFailover => return Ok(()),
                };
                let template = template.as_deref().context("no command to restore")?;
                run_command(template, name).await
            }
        }
    }

    /// Recent log lines of node `i`, when the drill started it.
    pub fn node_log(&self, i: usize) -> Option<String> {
        match self {
            Target::Local(l) => l.nodes.get(i).map(DelayqProcess::log),
            Target::Remote(_) => None,
        }
    }
}

/// What a scenario does to the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the leader: a standby sees its presence in Redis gone and ends its
    /// lease (or the lease expires, where no standby can tell).
    Kill,
    /// SIGTERM the leader: it resigns while stopping.
    Term,
    /// SIGSTOP the leader, SIGCONT after the takeover: a stale leader wakes up.
    Pause,
    /// Cut the leader off from Redis (etcd still in reach), restore after the takeover.
    RedisCut,
    /// Kill one etcd member (a different one each round), restart it later.
    EtcdLoss,
    /// `POST /v1/admin/resign` on the leader.
    Switchover,
    /// `SENTINEL FAILOVER`: a replica becomes the Redis master, the old master
    /// its replica; the drill asks Sentinel itself (no operator command).
    RedisFailover,
}

/// Runs one operator command with `{node}` / `{member}` replaced by `name`.
pub async fn run_command(template: &str, name: &str) -> anyhow::Result<()> {
    let command = template.replace("{node}", name).replace("{member}", name);
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&command)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("run `{command}`"))?;
    if !out.status.success() {
        bail!(
            "`{command}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn commands_get_the_name_and_report_failure() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("out");
        run_command(&format!("echo {{node}} > {}", file.display()), "delayq-2")
            .await
            .unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "delayq-2\n");
        let err = run_command("echo nope >&2; exit 3", "x")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nope") && err.contains("exit status: 3"),
            "{err}"
        );
    }

    #[test]
    fn remote_targets_need_commands_for_their_faults() {
        let target = Target::Remote(Box::new(Remote {
            nodes: vec![],
            redis: ProducerOptions::default(),
            etcd_members: vec![],
            commands: Commands {
                kill: Some("docker kill {node}".into()),
                ..Commands::default()
            },
        }));
        assert_eq!(
            target.missing_for(Fault::Kill),
            Some("--kill-cmd and --start-cmd")
        );
        assert_eq!(target.missing_for(Fault::Switchover), None);
        assert!(target.missing_for(Fault::EtcdLoss).is_some());
        // A Redis failover needs the nodes' Redis behind Sentinel (their --config).
        assert_eq!(
            target.missing_for(Fault::RedisFailover),
            Some(NEEDS_SENTINEL)
        );
        let Target::Remote(mut remote) = target else {
            unreachable!()
        };
        remote.redis.sentinel = Some(SentinelConfig {
            master: "main".into(),
            nodes: vec![("sentinel-1".into(), 26379)],
            user: None,
            password: None,
            tls: false,
        });
        assert_eq!(
            Target::Remote(remote).missing_for(Fault::RedisFailover),
            None
        );
    }
}
