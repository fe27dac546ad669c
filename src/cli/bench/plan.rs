//! What a run measures: the scenarios and their sizes as the suite and the options
//! say, checked before anything starts.

use super::*;

/// What one run does, after the suite's defaults and the options.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub(super) bursts: Vec<u64>,
    /// Leaders of the per-shard bursts.
    pub(super) leaders: Vec<u32>,
    /// Messages of each Redis Cluster burst (0: none).
    pub(super) cluster: u64,
    pub(super) rates: Vec<u64>,
    pub(super) search: bool,
    pub(super) duration: Duration,
    pub(super) backlog: u64,
    pub(super) backlog_rates: Vec<u64>,
    pub(super) ingest: u64,
    /// Batch ingest journaled too (see `BenchArgs::journaled`).
    pub(super) journaled: bool,
    pub(super) catchup: u64,
    pub(super) catchup_limit: u64,
    pub(super) repeat: u32,
    pub(super) peer: bool,
    pub(super) peer_bursts: Vec<u64>,
    pub(super) peer_rates: Vec<u64>,
    pub(super) ceiling: bool,
    pub(super) redis_benchmark_requests: u64,
    pub(super) failover_stops: Vec<failover::Stop>,
    pub(super) failover_rate: u64,
    pub(super) failover_after: Duration,
    /// Rounds of the SIGTERM and of the SIGKILL failover.
    pub(super) failover_rounds: (u32, u32),
    pub(super) lease_ttl: Duration,
    /// Recurring schedules firing together (0: none), how often, and the firings
    /// watched.
    pub(super) schedules: (u64, Duration, u32),
}

impl Plan {
    pub(super) fn new(args: &BenchArgs) -> Plan {
        let mut plan = match args.suite {
            Suite::Tiny => Plan {
                bursts: vec![2000],
                leaders: vec![2],
                cluster: 2000,
                rates: vec![500],
                search: false,
                duration: Duration::from_secs(2),
                backlog: 2000,
                backlog_rates: vec![500],
                ingest: 1000,
                journaled: false,
                catchup: 2000,
                catchup_limit: 1000,
                repeat: 1,
                peer: false,
                peer_bursts: vec![2000],
                peer_rates: vec![500],
                ceiling: true,
                redis_benchmark_requests: 2000,
                failover_stops: vec![failover::Stop::Term],
                failover_rate: 500,
                failover_after: Duration::from_secs(1),
                failover_rounds: (2, 1),
                lease_ttl: Duration::from_secs(2),
                schedules: (50, Duration::from_secs(1), 3),
            },
            Suite::Quick => Plan {
                bursts: vec![100_000],
                leaders: vec![1, 3],
                cluster: 100_000,
                rates: vec![1000, 10_000, 50_000],
                search: false,
                duration: Duration::from_secs(10),
                backlog: 100_000,
                backlog_rates: vec![1000, 10_000],
                ingest: 20_000,
                journaled: false,
                catchup: 100_000,
                catchup_limit: 20_000,
                repeat: 1,
                peer: true,
                peer_bursts: vec![100_000],
                peer_rates: vec![1000, 10_000],
                ceiling: true,
                redis_benchmark_requests: 200_000,
                failover_stops: vec![failover::Stop::Term, failover::Stop::Kill],
                failover_rate: 1000,
                failover_after: Duration::from_secs(3),
                failover_rounds: (10, 5),
                lease_ttl: Duration::from_secs(6),
                schedules: (1000, Duration::from_secs(10), 3),
            },
            Suite::Full => Plan {
                bursts: vec![100_000, 1_000_000],
                leaders: vec![1, 3],
                cluster: 200_000,
                rates: vec![1000, 2000, 5000, 10_000, 20_000, 30_000, 50_000],
                search: true,
                duration: Duration::from_secs(10),
                backlog: 1_000_000,
                backlog_rates: vec![1000, 10_000],
                ingest: 100_000,
                journaled: true,
                catchup: 500_000,
                catchup_limit: 50_000,
                repeat: 2,
                peer: true,
                peer_bursts: vec![100_000, 1_000_000],
                peer_rates: vec![1000, 10_000],
                ceiling: true,
                redis_benchmark_requests: 300_000,
                failover_stops: vec![
                    failover::Stop::Term,
                    failover::Stop::Kill,
                    failover::Stop::Pause,
                    failover::Stop::RedisCut,
                ],
                failover_rate: 1000,
                failover_after: Duration::from_secs(3),
                failover_rounds: (50, 20),
                lease_ttl: Duration::from_secs(6),
                schedules: (10_000, Duration::from_secs(60), 2),
            },
        };
        if let Some(bursts) = &args.burst {
            plan.bursts = bursts.iter().copied().filter(|n| *n > 0).collect();
            plan.peer_bursts = plan.bursts.clone();
        }
        if let Some(leaders) = &args.leaders {
            plan.leaders = leaders.iter().copied().filter(|n| *n > 0).collect();
        }
        if let Some(n) = args.cluster {
            plan.cluster = n;
        }
        if let Some(rates) = &args.rates {
            plan.rates = rates.iter().copied().filter(|n| *n > 0).collect();
            plan.backlog_rates = plan.rates.clone();
            plan.peer_rates = plan.rates.clone();
        }
        if let Some(search) = args.search {
            plan.search = search;
        }
        if let Some(d) = args.duration {
            plan.duration = d;
        }
        if let Some(n) = args.backlog {
            plan.backlog = n;
        }
        if let Some(n) = args.schedules {
            plan.schedules.0 = n;
        }
        if let Some(n) = args.ingest {
            plan.ingest = n;
        }
        if let Some(journaled) = args.journaled {
            plan.journaled = journaled;
        }
        if args.journal_url.is_some() {
            plan.journaled = false;
        }
        if let Some(n) = args.catchup {
            plan.catchup = n;
        }
        if let Some(n) = args.catchup_limit {
            plan.catchup_limit = n.max(1);
        }
        if let Some(n) = args.repeat {
            plan.repeat = n.max(1);
        }
        if args.no_peer {
            plan.peer = false;
        }
        if args.no_ceiling {
            plan.ceiling = false;
        }
        if let Some(stops) = &args.failover {
            plan.failover_stops = stops.clone();
        }
        if args.no_failover {
            plan.failover_stops.clear();
        }
        if let Some(rounds) = args.failover_rounds {
            plan.failover_rounds = (rounds, rounds);
        }
        if let Some(ttl) = args.lease_ttl {
            plan.lease_ttl = ttl;
        }
        plan
    }

    pub(super) fn parameters(&self, args: &BenchArgs) -> report::Parameters {
        report::Parameters {
            suite: format!("{:?}", args.suite).to_lowercase(),
            payload_bytes: args.payload,
            shards: args.shards,
            batch_size: args.batch_size,
            bursts: self.bursts.clone(),
            leaders: self.leaders.clone(),
            cluster: self.cluster,
            spread_rates: self.rates.clone(),
            spread_search: self.search,
            spread_seconds: self.duration.as_secs_f64(),
            spread_delay_ms: scenarios::SPREAD_DELAY.as_millis() as u64,
            spread_tick_ms: args.spread_tick.as_millis() as u64,
            backlog: self.backlog,
            backlog_rates: self.backlog_rates.clone(),
            ingest: self.ingest,
            catchup: self.catchup,
            catchup_limit: self.catchup_limit,
            repeat: self.repeat,
            peer: self.peer,
            peer_worker_concurrency: peer::WORKER_CONCURRENCY,
            ceiling_callers: ceiling::CALLERS,
            failover: self
                .failover_stops
                .iter()
                .map(|s| s.name().to_owned())
                .collect(),
            failover_rate: self.failover_rate,
            failover_after_seconds: self.failover_after.as_secs_f64(),
            failover_rounds: [self.failover_rounds.0, self.failover_rounds.1],
            lease_ttl_seconds: self.lease_ttl.as_secs_f64(),
        }
    }
}
