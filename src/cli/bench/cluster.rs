//! Redis Cluster (`redis.mode = "cluster"`) against a standalone Redis: the same
//! burst (`n` messages due at one instant, to 1 or 8 streams) drained by 1 leader
//! (`election.mode = "single"`) or 3 (`per_shard`, one election group each), on a
//! Redis Cluster of 3 masters (a replica each) and on a standalone Redis of its
//! own, both started here. Redis CPU is the masters' (standalone: the one Redis),
//! from INFO before and after the drain; throughput is from the first entry's time
//! to the last's; every id is counted in the streams (`measure::tally_streams`).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use redis::aio::MultiplexedConnection;

use super::Bench;
use super::measure::{self, HostCpu, PhaseCpu, per_message_us, process_cpu_secs, wall_ms};
use super::rows::{ClusterBurst, Delayq, Figures};
use super::scenarios::until_meters_start;
use delayq_client::message::{Due, MessageId, NewMessage};
use delayq_client::store::BatchItem;
use delayq_harness::{DelayqProcess, EtcdServer, RedisCluster, RedisServer};

/// What is measured: (streams, leaders).
const SHAPES: [(u32, u32); 3] = [(1, 1), (8, 1), (8, 3)];

/// One kind of Redis under the bench: where the daemons connect and how its CPU is read.
struct Target {
    redis: &'static str,
    /// `[redis]` lines of the daemons' config.
    config: String,
    /// One connection per master.
    masters: Vec<MultiplexedConnection>,
}

impl Target {
    async fn cpu_secs(&mut self) -> anyhow::Result<f64> {
        let mut sum = 0.0;
        for conn in &mut self.masters {
            let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
            for field in ["used_cpu_user:", "used_cpu_sys:"] {
                sum += info
                    .lines()
                    .find_map(|l| l.strip_prefix(field))
                    .context("INFO cpu")?
                    .trim()
                    .parse::<f64>()?;
            }
        }
        Ok(sum)
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        for conn in &mut self.masters {
            let () = redis::cmd("FLUSHALL").arg("SYNC").query_async(conn).await?;
        }
        Ok(())
    }
}

impl Bench {
    /// The Redis Cluster rows: every shape of [`SHAPES`] on a standalone Redis and
    /// on a 3-master cluster (shapes with 3 leaders only with `etcd`).
    pub async fn cluster_bursts(
        &self,
        etcd: Option<&EtcdServer>,
        n: u64,
    ) -> anyhow::Result<Vec<Figures>> {
        let standalone = RedisServer::start().context("start a standalone Redis")?;
        let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3))
            .await?
            .context("start a Redis Cluster of 3 masters")?;
        let masters: Vec<String> = (0..cluster.nodes.len())
            .filter(|&i| cluster.master_of_node(i))
            .map(|i| cluster.nodes[i].url())
            .collect();
        let mut targets = vec![
            Target {
                redis: "standalone",
                config: format!("url = \"{}\"\nshards = 16\n", standalone.url()),
                masters: vec![connect(&standalone.url()).await?],
            },
            Target {
                redis: "cluster",
                config: cluster.redis_section(),
                masters: {
                    let mut conns = Vec::new();
                    for url in &masters {
                        conns.push(connect(url).await?);
                    }
                    conns
                },
            },
        ];
        let mut rows = Vec::new();
        for target in &mut targets {
            for (streams, leaders) in SHAPES {
                if leaders > 1 && etcd.is_none() {
                    continue;
                }
                eprintln!(
                    "bench: burst {n} on {} Redis, {streams} stream(s), {leaders} leader(s)",
                    target.redis
                );
                rows.push(
                    self.cluster_burst(target, etcd, n, streams, leaders)
                        .await?,
                );
            }
        }
        Ok(rows)
    }

    async fn cluster_burst(
        &self,
        target: &mut Target,
        etcd: Option<&EtcdServer>,
        n: u64,
        streams: u32,
        leaders: u32,
    ) -> anyhow::Result<Figures> {
        target.flush().await?;
        let mut config = format!(
            "[redis]\n{}prefix = \"bench\"\n[log]\nlevel = \"warn\"\n",
            target.config
        );
        if let (Some(etcd), true) = (etcd, leaders > 1) {
            config.push_str(&format!(
                "[etcd]\nendpoints = [\"{}\"]\ncluster = \"bench-cluster-{}\"\nlease_ttl = \"6s\"\n\
                 [election]\nmode = \"per_shard\"\ngroups = {leaders}\n",
                etcd.endpoint(),
                wall_ms()
            ));
        }
        let store = super::bench_store(&delayq_client::config::Config::from_toml(
            &format!("{config}[api]\nlisten = \"127.0.0.1:0\"\n"),
            std::iter::empty(),
        )?)
        .await?;
        let mut daemons = Vec::new();
        for i in 0..leaders {
            daemons.push(DelayqProcess::start(
                &self.delayq_bin,
                &format!("bench-cluster-{i}"),
                &config,
            )?);
        }
        self.wait_until_led(&daemons, leaders).await?;

        let names: Vec<String> = (0..streams).map(|s| format!("bench-s{s}")).collect();
        // Loading into one stream's slot goes through one shard (one script call
        // at a time on one master): give it time.
        // (Twice what an idle machine needs, times how busy the machine is: at a
        // load of 19 on 2 CPUs, loading 2000 took longer than 6.5 s and the burst
        // began during its load.)
        let allowed = ((6000 + n / 4) as f64 * measure::busy_factor()) as u64;
        let due_at = store.now_ms().await? + allowed;
        let items: Vec<BatchItem> = (0..n)
            .map(|i| {
                BatchItem::new(
                    NewMessage::new(
                        names[(i % u64::from(streams)) as usize].clone(),
                        vec![("payload".to_owned(), self.payload.clone())],
                        Due::At(due_at),
                    )
                    .with_id(MessageId::parse(&format!("c{i}")).expect("a valid id")),
                )
            })
            .collect();
        for chunk in items.chunks(5000) {
            let calls = chunk
                .chunks(500)
                .map(|c| store.schedule_many(c, Duration::from_secs(3600), None));
            for outcomes in futures::future::join_all(calls).await {
                if let Some(e) = outcomes.into_iter().find_map(Result::err) {
                    bail!("scheduling the burst failed: {e}");
                }
            }
        }
        until_meters_start(&store, n, due_at, allowed).await?;
        let load = measure::load_average();
        let pids: Vec<u32> = daemons.iter().filter_map(DelayqProcess::pid).collect();
        let (redis_start, workers_start, host_start) = (
            target.cpu_secs().await?,
            pids.iter()
                .filter_map(|p| process_cpu_secs(*p))
                .sum::<f64>(),
            HostCpu::now(),
        );
        let deadline = Instant::now() + Duration::from_secs(120) + Duration::from_millis(n / 2);
        // Target streams are read over a connection that follows each to its slot.
        let mut reader = store.blocking_connection().await?;
        let entries = loop {
            let mut total = 0u64;
            for name in &names {
                let len: u64 = redis::cmd("XLEN")
                    .arg(name)
                    .query_async(&mut reader)
                    .await?;
                total += len;
            }
            if total >= n {
                break total;
            }
            if Instant::now() > deadline {
                bail!("{total} of {n} forwarded in time");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let redis_secs = target.cpu_secs().await? - redis_start;
        let workers: f64 = pids
            .iter()
            .filter_map(|p| process_cpu_secs(*p))
            .sum::<f64>()
            - workers_start;
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let tally = measure::tally_streams(&mut reader, &names, "c", n, |_| due_at).await?;
        let (_, rate) = measure::drain(tally.first_ms, tally.last_ms, entries);
        for mut daemon in daemons {
            daemon.terminate(Duration::from_secs(10));
        }
        let cpu = PhaseCpu {
            redis_us: per_message_us(redis_secs, n),
            worker_us: Some(per_message_us(workers, n)),
            longest_event_ms: 0,
            // INFO commandstats of every master would be needed; not measured.
            scripts: None,
            stolen_percent: host_start.and_then(HostCpu::stolen_since_now),
        };
        // No PING probe here: the stalls are the main burst rows' subject.
        let probe = measure::Probe::default();
        Ok(Delayq::ClusterBurst(ClusterBurst {
            measured: measure::measured_delayq(n, load, rate, &cpu, &probe, tally.counts()),
            redis: target.redis.to_owned(),
            masters: target.masters.len() as u32,
            streams,
            leaders,
        })
        .into())
    }

    /// Waits until `daemons` lead: the one of a single leader, or one election
    /// group each.
    async fn wait_until_led(&self, daemons: &[DelayqProcess], leaders: u32) -> anyhow::Result<()> {
        if leaders > 1 {
            return self
                .wait_one_group_each(daemons, Duration::from_secs(60))
                .await;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.leads(&daemons[0]).await {
            if Instant::now() > deadline {
                bail!(
                    "delayq did not lead within 20s; its log:\n{}",
                    daemons[0].log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

async fn connect(url: &str) -> anyhow::Result<MultiplexedConnection> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}
