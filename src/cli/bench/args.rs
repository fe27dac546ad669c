//! The bench's command line: which scenarios run, their sizes and rates, and the
//! systems measured beside delayq.

use super::*;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Which set of scenarios and sizes; the options below override its choices.
    #[arg(long, value_enum, default_value = "quick")]
    pub suite: Suite,
    /// Burst sizes (messages due at one instant), comma-separated; 0 skips.
    #[arg(long, value_delimiter = ',')]
    pub burst: Option<Vec<u64>>,
    /// Spread rates (msg/s), comma-separated; with --search, the ladder climbed
    /// until p99 lateness reaches 10 ms.
    #[arg(long = "rate", value_delimiter = ',')]
    pub rates: Option<Vec<u64>>,
    /// Climb the rates until one is not on time (instead of running each).
    #[arg(long)]
    pub search: Option<bool>,
    /// How long each spread sends.
    #[arg(long, value_parser = delayq_client::message::parse_duration)]
    pub duration: Option<Duration>,
    /// Far-future messages pending during the backlog scenario (0 skips it).
    #[arg(long)]
    pub backlog: Option<u64>,
    /// Recurring schedules firing together in the schedules scenario (0 skips it;
    /// the suite sets how often they fire: tiny every 1s, quick 10s, full 1m).
    #[arg(long)]
    pub schedules: Option<u64>,
    /// Messages in each ingest scenario (HTTP, batch HTTP, inbox); 0 skips them.
    #[arg(long)]
    pub ingest: Option<u64>,
    /// Overdue messages in the catch-up scenario (0 skips it): drained at
    /// --catchup-limit while 1000 msg/s of live traffic go to another stream.
    #[arg(long)]
    pub catchup: Option<u64>,
    /// The catch-up stream's streams.max_rate (msg/s).
    #[arg(long)]
    pub catchup_limit: Option<u64>,
    /// Runs of every scenario.
    #[arg(long)]
    pub repeat: Option<u32>,
    /// Leaders of the per-shard burst (`election.mode = "per_shard"`, one election
    /// group each, needs etcd), comma-separated: the first burst size drained by
    /// each count of leaders; 0 skips.
    #[arg(long, value_delimiter = ',')]
    pub leaders: Option<Vec<u32>>,
    /// Messages of each Redis Cluster burst (a 3-master cluster against a
    /// standalone Redis, both started for it; 1 and 8 streams, 1 and 3 leaders);
    /// 0 skips.
    #[arg(long)]
    pub cluster: Option<u64>,
    /// Skip the BullMQ peer.
    #[arg(long)]
    pub no_peer: bool,
    /// Skip the ceiling (Lua loop and redis-benchmark).
    #[arg(long)]
    pub no_ceiling: bool,
    /// How the leader is stopped in the failover scenario, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub failover: Option<Vec<failover::Stop>>,
    /// Skip failover under load (needs etcd).
    #[arg(long)]
    pub no_failover: bool,
    /// Rounds of each failover (the leader stopped, started again as the standby,
    /// the new leader stopped in turn); default by suite: SIGTERM 50, SIGKILL 20,
    /// pause and redis-cut 5 in the full suite.
    #[arg(long)]
    pub failover_rounds: Option<u32>,
    /// etcd lease TTL of the daemons in the failover scenario (etcd.lease_ttl).
    #[arg(long, value_parser = delayq_client::message::parse_duration)]
    pub lease_ttl: Option<Duration>,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub payload: usize,
    /// Shards (redis.shards).
    #[arg(long, default_value_t = 16)]
    pub shards: u16,
    /// How often the spread producers send what has come due to be sent, in one
    /// call each time (1ms to 1s): 1ms is a producer that sends each message as it
    /// comes; longer gathers messages into fewer calls, as a producer or gateway
    /// that batches its sends.
    #[arg(long, default_value = "1ms", value_parser = parse_spread_tick)]
    pub spread_tick: Duration,
    /// Messages per forward call (forwarder.batch_size), also the ceiling's batch.
    #[arg(long, default_value_t = 200)]
    pub batch_size: usize,
    /// Use this Redis instead of starting one. It is FLUSHALLed between scenarios.
    #[arg(long)]
    pub redis_url: Option<String>,
    /// The delayq binary to run as the daemon under test (default: this one).
    #[arg(long)]
    pub delayq_bin: Option<PathBuf>,
    /// Journal every daemon's messages into this MySQL / MariaDB (`[journal] url`,
    /// password included), emptied with Redis between scenarios: the ingest rows
    /// then include the journal's cost.
    #[arg(long)]
    pub journal_url: Option<String>,
    /// Batch ingest with ids once more with the journal on, into a MariaDB of the
    /// bench's own (`mariadbd` on a free loopback port): the full suite's default,
    /// skipped under --journal-url (every row is journaled then).
    #[arg(long)]
    pub journaled: Option<bool>,
    /// Where the peer's package.json and script are.
    #[arg(long, default_value = "bench/peer")]
    pub peer_dir: PathBuf,
    /// Dashboards open on the daemon under test during the burst and spread
    /// scenarios: each asks for the overview, the nodes, the history and the
    /// stream table every 2 s, as the page does (0: none).
    #[arg(long, default_value_t = 0)]
    pub dashboards: usize,
    /// Write results.json and results.md here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
}

/// The range of `--spread-tick`.
const SPREAD_TICK: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(1);

/// `--spread-tick`: a duration within [`SPREAD_TICK`].
pub(super) fn parse_spread_tick(text: &str) -> Result<Duration, String> {
    let tick = delayq_client::message::parse_duration(text)?;
    if SPREAD_TICK.contains(&tick) {
        Ok(tick)
    } else {
        Err(format!("{text}: the spread tick must be 1ms to 1s"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_spread_tick_is_taken_at_both_ends_and_refused_past_them() {
        for (text, tick) in [("1ms", 1), ("1s", 1000), ("10ms", 10)] {
            assert_eq!(
                parse_spread_tick(text),
                Ok(Duration::from_millis(tick)),
                "{text}"
            );
        }
        for text in ["0ms", "0s", "1001ms", "2s", "", "fast"] {
            assert!(parse_spread_tick(text).is_err(), "{text}");
        }
        let err = parse_spread_tick("2s").unwrap_err();
        assert!(err.contains("1ms to 1s"), "{err}");
    }

    proptest! {
        #[test]
        fn a_tick_in_milliseconds_is_taken_exactly_within_the_range(ms in 0u64..5000) {
            let parsed = parse_spread_tick(&format!("{ms}ms"));
            match ms {
                1..=1000 => prop_assert_eq!(parsed, Ok(Duration::from_millis(ms))),
                _ => prop_assert!(parsed.is_err()),
            }
        }

        #[test]
        fn any_text_is_read_without_panicking(text in any::<String>()) {
            let _ = parse_spread_tick(&text);
        }
    }
}
