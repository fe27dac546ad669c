//! `delayq drill`: a failover drill with a report people can trust.
//!
//! Against a cluster it starts itself (redis-server, an etcd cluster and N
//! `delayq run` processes on loopback) or an existing one (node APIs plus
//! operator commands), it sends a steady load of delayed messages, runs the
//! chosen scenarios round after round against whichever node leads, reads the
//! target stream, and reports per scenario: takeover time, messages sent,
//! delivered, lost and duplicated, and the worst lateness. Exit status 1 when
//! anything was lost or duplicated or a takeover did not happen.

mod args;
mod load;
mod probe;
mod report;
mod round;
mod target;

pub use args::DrillArgs;
use round::run_round;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

use delayq_client::client::ProducerOptions;
use delayq_client::config::Config;
use delayq_client::secret::RedisUrl;

use load::{Load, Traffic};
use probe::{
    redis_failover, redis_settled, settle, wait_single_leader, wait_takeover, watch_leadership,
};
use report::{RoundResult, build_report, ms, print_table};
use target::{Commands, Fault, LocalSpec, Node, Remote, Target};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// SIGKILL the leader; a standby sees it gone from Redis and ends its lease (or the lease expires).
    Kill,
    /// SIGTERM the leader; it resigns on the way out.
    Term,
    /// SIGSTOP the leader, SIGCONT it after the takeover (a stale leader wakes).
    Pause,
    /// Cut the leader off from Redis while etcd stays in reach; a standby that
    /// reaches Redis takes over; the cut is undone after the takeover.
    RedisCut,
    /// Kill one etcd member (another each round) for --hold, then restart it.
    Etcd,
    /// POST /v1/admin/resign on the leader.
    Switchover,
    /// SENTINEL FAILOVER: a replica becomes the Redis master; forwarding follows
    /// it (Redis behind Sentinel only).
    RedisFailover,
}

impl Scenario {
    const ALL: [Scenario; 7] = [
        Scenario::Kill,
        Scenario::Term,
        Scenario::Pause,
        Scenario::RedisCut,
        Scenario::Etcd,
        Scenario::Switchover,
        Scenario::RedisFailover,
    ];

    fn fault(self) -> Fault {
        match self {
            Scenario::Kill => Fault::Kill,
            Scenario::Term => Fault::Term,
            Scenario::Pause => Fault::Pause,
            Scenario::RedisCut => Fault::RedisCut,
            Scenario::Etcd => Fault::EtcdLoss,
            Scenario::Switchover => Fault::Switchover,
            Scenario::RedisFailover => Fault::RedisFailover,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Scenario::Kill => "kill",
            Scenario::Term => "term",
            Scenario::Pause => "pause",
            Scenario::RedisCut => "redis-cut",
            Scenario::Etcd => "etcd",
            Scenario::Switchover => "switchover",
            Scenario::RedisFailover => "redis-failover",
        }
    }
}

/// Exit status: 0 all good, 1 something was lost or duplicated or a round
/// failed, 2 the drill could not run.
pub fn main(args: Box<DrillArgs>) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime");
    let result = runtime.block_on(async {
        tokio::select! {
            r = run(*args) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted; tearing down")),
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("drill: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn parse_nodes(specs: &[String]) -> anyhow::Result<Vec<Node>> {
    specs
        .iter()
        .map(|s| {
            let (name, url) = s
                .split_once('=')
                .with_context(|| format!("--node {s:?}: expected NAME=URL"))?;
            if name.is_empty() || !url.starts_with("http") {
                bail!("--node {s:?}: expected NAME=http://host:port");
            }
            Ok(Node {
                name: name.to_owned(),
                url: url.trim_end_matches('/').to_owned(),
            })
        })
        .collect()
}

/// The drill's voice: progress bar lines on a terminal, stderr otherwise,
/// nothing with --json.
struct Say {
    bar: ProgressBar,
    quiet: bool,
}

impl Say {
    fn line(&self, text: impl AsRef<str>) {
        if self.quiet {
            return;
        }
        if self.bar.is_hidden() {
            eprintln!("{}", text.as_ref());
        } else {
            self.bar.println(text.as_ref());
        }
    }
}

async fn run(args: DrillArgs) -> anyhow::Result<bool> {
    if args.rate == 0 || args.rounds == 0 {
        bail!("--rate and --rounds must be at least 1");
    }
    let run_id = ulid::Ulid::new().to_string()[20..].to_ascii_lowercase();
    let stream = args
        .stream
        .clone()
        .unwrap_or_else(|| format!("drill-{run_id}"));

    let mut target = if args.node.is_empty() {
        if args.nodes < 2 {
            bail!("--nodes: a drill needs at least 2 nodes");
        }
        if args.lease_ttl < Duration::from_secs(2) || args.lease_ttl.subsec_nanos() != 0 {
            bail!("--lease-ttl: whole seconds, at least 2s (etcd's minimum)");
        }
        if (args.redis_cluster || args.redis_sentinel)
            && args.scenarios.contains(&Scenario::RedisCut)
        {
            bail!("scenario redis-cut: needs {}", target::NO_CUT_ON_CLUSTER);
        }
        if !args.redis_sentinel && args.scenarios.contains(&Scenario::RedisFailover) {
            bail!("scenario redis-failover: needs {}", target::NEEDS_SENTINEL);
        }
        let wants_etcd_loss = args.scenarios.is_empty() || args.scenarios.contains(&Scenario::Etcd);
        let bin = std::env::current_exe().context("find the delayq binary")?;
        let spec = LocalSpec {
            bin: &bin,
            nodes: args.nodes,
            // Losing one member of three is the realistic fault; one is enough otherwise.
            etcd_members: if wants_etcd_loss { 3 } else { 1 },
            lease_ttl: args.lease_ttl,
            shards: args.shards,
            redis_cluster: args.redis_cluster,
            redis_sentinel: args.redis_sentinel,
        };
        tokio::task::block_in_place(|| Target::start_local(&spec))?
    } else {
        if args.redis_cluster || args.redis_sentinel {
            bail!(
                "--redis-cluster, --redis-sentinel: for a cluster the drill starts (without --node); give an existing cluster's Redis with --config"
            );
        }
        Target::Remote(Box::new(Remote {
            nodes: parse_nodes(&args.node)?,
            redis: match (&args.redis_url, &args.config) {
                (_, Some(path)) => ProducerOptions::from_config(
                    &Config::load(Some(path))
                        .with_context(|| format!("--config {}", path.display()))?,
                ),
                (Some(url), None) => ProducerOptions {
                    redis_url: RedisUrl::new(url.clone()),
                    // The nodes' count, as their Redis keeps it.
                    shards: 0,
                    ..ProducerOptions::default()
                },
                (None, None) => bail!(
                    "--redis-url or --config: required with --node (the drill reads the stream)"
                ),
            },
            etcd_members: args.etcd_member.clone(),
            commands: Commands {
                kill: args.kill_cmd.clone(),
                term: args.term_cmd.clone(),
                start: args.start_cmd.clone(),
                pause: args.pause_cmd.clone(),
                resume: args.resume_cmd.clone(),
                etcd_kill: args.etcd_kill_cmd.clone(),
                etcd_start: args.etcd_start_cmd.clone(),
                redis_cut: args.redis_cut_cmd.clone(),
                redis_restore: args.redis_restore_cmd.clone(),
            },
        }))
    };
    let scenarios: Vec<Scenario> = if args.scenarios.is_empty() {
        Scenario::ALL
            .into_iter()
            .filter(|s| target.missing_for(s.fault()).is_none())
            .collect()
    } else {
        for s in &args.scenarios {
            if let Some(missing) = target.missing_for(s.fault()) {
                bail!("scenario {}: needs {missing}", s.name());
            }
        }
        args.scenarios.clone()
    };
    if scenarios.is_empty() {
        bail!("no scenario can run against this cluster: give operator commands (see --help)");
    }
    let takeover_timeout = args.takeover_timeout.unwrap_or(if target.is_local() {
        args.lease_ttl * 5 + Duration::from_secs(5)
    } else {
        Duration::from_secs(30)
    });
    let nodes = target.nodes();

    let total_rounds = scenarios.len() as u64 * u64::from(args.rounds);
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total_rounds)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {elapsed:>4} {bar:16} {pos}/{len} {msg} ({prefix})",
        )
        .expect("a valid template"),
    );
    let say = Say {
        bar: bar.clone(),
        quiet: args.json,
    };
    say.line(format!(
        "drill {run_id}: {} nodes ({}), stream {stream:?}, {} msg/s due {} after sending, scenarios {}, {} rounds each",
        nodes.len(),
        if target.is_local() { "started locally" } else { "existing cluster" },
        args.rate,
        delayq_client::human::duration(args.delay),
        scenarios.iter().map(|s| s.name()).collect::<Vec<_>>().join(","),
        args.rounds,
    ));

    let http = load::http_client(
        Duration::from_millis(500),
        args.token.as_deref(),
        &nodes,
        args.ca_file.as_deref(),
    )?;
    let first = wait_single_leader(&http, &nodes, takeover_timeout)
        .await
        .context("waiting for the cluster to elect a leader")?;
    say.line(format!(
        "leader: {} (epoch {})",
        nodes[first.0].name, first.1
    ));

    // Redis's clock, for phase boundaries comparable with due and entry times.
    let connection = delayq_client::client::Producer::with_options(target.redis())
        .await
        .context("connect to Redis")?;
    let clock = connection.store();
    let traffic = Traffic::new(nodes.len(), redis_now(clock).await?);
    let stop_consumer = CancellationToken::new();
    let consumer = tokio::spawn(load::consume(
        connection.store().clone(),
        stream.clone(),
        args.id_field.clone(),
        traffic.clone(),
        stop_consumer.clone(),
    ));
    let stop_producer = CancellationToken::new();
    let producer = tokio::spawn(load::produce(
        Load {
            nodes: nodes.clone(),
            stream: stream.clone(),
            rate: args.rate,
            delay: args.delay,
            run_id: format!("drill-{run_id}"),
            token: args.token.clone(),
            ca_file: args.ca_file.clone(),
        },
        traffic.clone(),
        stop_producer.clone(),
    ));
    let ticker = {
        let (bar, traffic) = (bar.clone(), traffic.clone());
        let stop = stop_consumer.clone();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let (sent, delivered) = {
                    let l = traffic.ledger();
                    (l.sent_count(), l.delivered_count())
                };
                bar.set_prefix(format!("sent {sent} delivered {delivered}"));
                bar.tick();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    bar.set_message("steady load");
    tokio::time::sleep(args.steady).await;

    let mut results: Vec<Vec<RoundResult>> = Vec::new();
    // Set when the cluster did not settle after a failed round: no more faults.
    let mut stopped = false;
    for scenario in &scenarios {
        traffic.next_phase(redis_now(clock).await?);
        let mut rounds = Vec::new();
        for r in 0..args.rounds {
            bar.set_message(format!(
                "{} round {}/{}",
                scenario.name(),
                r + 1,
                args.rounds
            ));
            let round = Round {
                scenario: *scenario,
                index: r as usize,
                timeout: takeover_timeout,
                hold: args.hold,
            };
            let result = run_round(&mut target, &http, &traffic, (clock, &stream), round).await;
            let result = match result {
                Ok(result) => result,
                Err(e) => RoundResult {
                    takeover: None,
                    leader_changed: false,
                    problem: Some(format!("{e:#}")),
                },
            };
            say.line(format!(
                "{} round {}: {}{}",
                scenario.name(),
                r + 1,
                match result.takeover {
                    Some(t) => format!("takeover {}", ms(t)),
                    None => "no takeover".into(),
                },
                result
                    .problem
                    .as_ref()
                    .map(|p| format!(" — {p}"))
                    .unwrap_or_default()
            ));
            let failed = result.problem.is_some();
            rounds.push(result);
            bar.inc(1);
            tokio::time::sleep(args.gap).await;
            if failed {
                // The cluster is in an unknown state: settle it before going on.
                if let Err(e) = settle(&http, &nodes, &traffic, takeover_timeout).await {
                    say.line(format!("cluster did not settle: {e:#}; stopping the drill"));
                    stopped = true;
                    break;
                }
            }
        }
        results.push(rounds);
        if stopped {
            break;
        }
    }

    bar.set_message("waiting for the last messages");
    stop_producer.cancel();
    let _ = producer.await;
    let give_up_after = args.delay + takeover_timeout + Duration::from_secs(2);
    let waited = Instant::now();
    // What the live reader missed (entries a Redis failover wrote below where it
    // had read) shows when the stream is read again: every second.
    let mut discarded = 0;
    let mut recounted = Instant::now();
    while traffic.ledger().outstanding() > 0 && waited.elapsed() < give_up_after {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if recounted.elapsed() >= Duration::from_secs(1) {
            // A failed read is tried again a second later.
            if let Ok(gone) = load::recount(clock, &stream, &args.id_field, &traffic, false).await {
                discarded += gone;
            }
            recounted = Instant::now();
        }
    }
    // A late duplicate would come from a stale leader; give one more moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_consumer.cancel();
    consumer.await.context("the stream reader")??;
    let _ = ticker.await;
    // The stream as it stands is what counts.
    discarded += load::recount(clock, &stream, &args.id_field, &traffic, true)
        .await
        .context("read the stream at the end")?;
    bar.finish_and_clear();

    let counts = traffic.count(args.delay);
    if args.stream.is_none() && !args.keep_stream {
        // Its own stream, named for this run: nobody else reads it.
        match clock.remove_stream(&stream).await {
            Ok(_) => tracing::info!(stream, "drill: its stream deleted (--keep-stream keeps it)"),
            Err(e) => eprintln!("delayq drill: could not delete its stream {stream:?}: {e}"),
        }
    }
    let report = build_report(
        &args,
        &target,
        &stream,
        &scenarios,
        &results,
        &counts,
        discarded as u64,
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    let ok = report.ok;
    if !ok && target.is_local() {
        for (i, node) in nodes.iter().enumerate() {
            if let Some(log) = target.node_log(i) {
                eprintln!("\n--- last lines of {}'s log ---\n{log}", node.name);
            }
        }
    }
    drop(target);
    Ok(ok)
}

/// One round of a scenario.
struct Round {
    scenario: Scenario,
    /// Which round of the scenario (from 0).
    index: usize,
    /// Give up on a takeover (or on the cluster settling) after this long.
    timeout: Duration,
    /// How long an etcd member stays down.
    hold: Duration,
}

/// Redis's clock, asked again for up to 30 s: a round that restarted or cut Redis,
/// or a loaded machine, may leave one call timing out, which must not end the drill.
async fn redis_now(store: &delayq_client::store::Store) -> anyhow::Result<u64> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match store.now_ms().await {
            Ok(now) => return Ok(now),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(anyhow::Error::new(e).context("read Redis's clock (30 s)"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_node(spec: &str, expected: Result<(&str, &str), &str>) {
        match (parse_nodes(&[spec.to_owned()]), expected) {
            (Ok(nodes), Ok((name, url))) => {
                assert_eq!((nodes[0].name.as_str(), nodes[0].url.as_str()), (name, url))
            }
            (Err(e), Err(part)) => assert!(e.to_string().contains(part), "{e}"),
            (got, want) => panic!("{spec}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn node_specs() {
        check_node(
            "delayq-1=http://127.0.0.1:7071/",
            Ok(("delayq-1", "http://127.0.0.1:7071")),
        );
        check_node("delayq-1", Err("expected NAME=URL"));
        check_node("=http://x", Err("expected NAME=http"));
        check_node("a=127.0.0.1:7071", Err("expected NAME=http"));
    }
}
