//! The drill's command line: the scenarios, the load, and how to reach and stop the
//! nodes of a deployment of the operator's (or of the drill's own cluster).

use super::*;

#[derive(Args, Debug)]
pub struct DrillArgs {
    /// Scenarios, comma-separated. Default: every one the target can run.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(super) scenarios: Vec<Scenario>,
    /// Rounds per scenario.
    #[arg(long, default_value_t = 3)]
    pub(super) rounds: u32,
    /// Messages pushed per second, all through the run.
    #[arg(long, default_value_t = 100)]
    pub(super) rate: u32,
    /// How far ahead each message is due.
    #[arg(long, default_value = "1s", value_parser = delayq_client::message::parse_duration)]
    pub(super) delay: Duration,
    /// Load before the first scenario (the "steady" row: lateness without faults;
    /// it counts the messages due within it, so make it longer than --delay).
    #[arg(long, default_value = "3s", value_parser = delayq_client::message::parse_duration)]
    pub(super) steady: Duration,
    /// Steady load after each round, before the next one: each round's effects
    /// land in its own scenario, and switchovers do not follow each other faster
    /// than the election's resign pause.
    #[arg(long, default_value = "1s", value_parser = delayq_client::message::parse_duration)]
    pub(super) gap: Duration,
    /// How long an etcd member stays down in the etcd scenario.
    #[arg(long, default_value = "4s", value_parser = delayq_client::message::parse_duration)]
    pub(super) hold: Duration,
    /// Give up on a takeover (or on the cluster settling) after this long.
    /// Default: 5 × lease TTL + 5s for a local cluster, 30s otherwise.
    #[arg(long, value_parser = delayq_client::message::parse_duration)]
    pub(super) takeover_timeout: Option<Duration>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub(super) json: bool,
    /// Bearer token for the nodes' API, when they have api.tokens set.
    #[arg(long, env = "DELAYQ_TOKEN", hide_env_values = true)]
    pub(super) token: Option<String>,
    /// Existing cluster served over https (`api.tls`): a PEM file of CAs to trust
    /// besides the system's.
    #[arg(long, env = "DELAYQ_CA_FILE", value_name = "PEM")]
    pub(super) ca_file: Option<std::path::PathBuf>,

    /// Local cluster: delayq processes to start.
    #[arg(long, default_value_t = 3)]
    pub(super) nodes: usize,
    /// Local cluster: etcd.lease_ttl of the nodes (whole seconds, at least 2s).
    #[arg(long, default_value = "2s", value_parser = delayq_client::message::parse_duration)]
    pub(super) lease_ttl: Duration,
    /// Local cluster: redis.shards of the nodes.
    #[arg(long, default_value_t = 4)]
    pub(super) shards: u16,
    /// Local cluster: run the nodes on a Redis Cluster of three masters and three
    /// replicas (redis.mode = "cluster") instead of one redis-server; every
    /// scenario but redis-cut (the nodes reach every master directly).
    #[arg(long)]
    pub(super) redis_cluster: bool,
    /// Local cluster: run the nodes on a Redis master with two replicas behind
    /// three Sentinels (redis.sentinel, redis.min_replicas_acked = 1) instead of
    /// one redis-server; adds the redis-failover scenario, drops redis-cut.
    #[arg(long, conflicts_with = "redis_cluster")]
    pub(super) redis_sentinel: bool,

    /// Existing cluster: a node as NAME=API_URL (repeat for each); NAME is what
    /// {node} stands for in the commands. Without --node the drill starts its own.
    #[arg(long = "node", value_name = "NAME=URL")]
    pub(super) node: Vec<String>,
    /// Existing cluster: the Redis the nodes use (the drill reads the target stream).
    #[arg(long, conflicts_with = "config")]
    pub(super) redis_url: Option<String>,
    /// Existing cluster: a delayq configuration file to reach Redis as the nodes do
    /// (TLS, an ACL user and its password file, Sentinel), instead of --redis-url.
    #[arg(long)]
    pub(super) config: Option<std::path::PathBuf>,
    /// Existing cluster: SIGKILL a node, e.g. "docker kill {node}" or
    /// "systemctl kill -s SIGKILL delayq@{node}".
    #[arg(long)]
    pub(super) kill_cmd: Option<String>,
    /// Existing cluster: stop a node gracefully, e.g. "docker stop -t 20 {node}".
    #[arg(long)]
    pub(super) term_cmd: Option<String>,
    /// Existing cluster: start a node again, e.g. "docker start {node}".
    #[arg(long)]
    pub(super) start_cmd: Option<String>,
    /// Existing cluster: freeze a node, e.g. "docker pause {node}".
    #[arg(long)]
    pub(super) pause_cmd: Option<String>,
    /// Existing cluster: unfreeze a node, e.g. "docker unpause {node}".
    #[arg(long)]
    pub(super) resume_cmd: Option<String>,
    /// Existing cluster: cut a node off from Redis (etcd still in reach), e.g.
    /// "docker network disconnect redis-net {node}".
    #[arg(long)]
    pub(super) redis_cut_cmd: Option<String>,
    /// Existing cluster: undo the cut, e.g. "docker network connect redis-net {node}".
    #[arg(long)]
    pub(super) redis_restore_cmd: Option<String>,
    /// Existing cluster: an etcd member's name, for {member} (repeat for each).
    #[arg(long = "etcd-member", value_name = "NAME")]
    pub(super) etcd_member: Vec<String>,
    /// Existing cluster: kill an etcd member, e.g. "docker kill {member}".
    #[arg(long)]
    pub(super) etcd_kill_cmd: Option<String>,
    /// Existing cluster: start an etcd member again, e.g. "docker start {member}".
    #[arg(long)]
    pub(super) etcd_start_cmd: Option<String>,
    /// Target stream (must be allowed by streams.allow). Default: drill-<run id>,
    /// deleted when the drill ends (unless --keep-stream); a stream given here is kept.
    #[arg(long)]
    pub(super) stream: Option<String>,
    /// Keep the drill's own stream (drill-<run id>) when it ends, to look at it.
    #[arg(long)]
    pub(super) keep_stream: bool,
    /// The field carrying the message id in forwarded entries (forwarder.id_field).
    #[arg(long, default_value = "delayq-id")]
    pub(super) id_field: String,
}
