//! Spread scenarios: a producer sending a steady rate, each message due a while
//! after it is sent, alone, climbing until lateness reaches its limit, or over a
//! backlog due later.

use super::*;

impl Bench {
    /// Spread: `rate` messages a second for `duration`, each due `SPREAD_DELAY` after
    /// it is sent, with a daemon already running.
    pub async fn spread(&self, rate: u64, duration: Duration) -> anyhow::Result<Spread> {
        let mut conn = self.conn.clone();
        let _: u64 = conn.del(SPREAD_STREAM).await?;
        let mut daemon = self.start_delayq("bench-spread").await?;
        let _dashboards = self.open_dashboards(&daemon);
        let total = (rate as f64 * duration.as_secs_f64()).round().max(1.0) as u64;
        let prefix = format!("s{rate}-");

        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let meter = CpuMeter::start(&mut conn, daemon.pid()).await?;
        let (dues, achieved) = self.producer(SPREAD_STREAM, &prefix, rate, total).await?;
        let deadline = Instant::now() + SPREAD_DELAY + Duration::from_secs(30);
        self.wait_for_entries(SPREAD_STREAM, total, deadline)
            .await?;
        let cpu = meter.stop(&mut conn, total).await?;
        let probe = probe.finish()?;
        daemon.terminate(Duration::from_secs(10));
        let tally = tally_stream(&mut conn, SPREAD_STREAM, &prefix, total, |i| {
            dues[i as usize]
        })
        .await?;
        let p99 = (!tally.lateness.is_empty()).then(|| tally.lateness.value_at_quantile(0.99));
        let kept_up = achieved >= rate as f64 * 0.95;
        Ok(Spread {
            on_time: p99.is_some_and(|p| p < SPREAD_P99_LIMIT_MS) && kept_up && tally.lost == 0,
            measured: measured_delayq(
                total,
                load,
                achieved.round() as u64,
                &cpu,
                &probe,
                tally.counts(),
            ),
            rate_per_sec: rate,
            producer_kept_up: kept_up,
            lateness_ms: summary(&tally.lateness),
            backlog: None,
        })
    }

    /// Schedules `total` messages `<prefix><n>` at `rate` a second, each due
    /// `SPREAD_DELAY` after it is sent; returns their due times and the rate achieved.
    /// Every `--spread-tick` (a millisecond unless set), what is due to be sent goes
    /// in one `schedule_many` (one script call), so the producer can offer well over
    /// 100k msg/s.
    pub(crate) fn producer(
        &self,
        stream: &str,
        prefix: &str,
        rate: u64,
        total: u64,
    ) -> impl Future<Output = anyhow::Result<(Vec<u64>, f64)>> + Send + 'static {
        let store = self.store.clone();
        let max_delay = self.config.api.limits.max_delay;
        let template = self.message(stream, format!("{prefix}0"), Due::In(SPREAD_DELAY));
        let prefix = prefix.to_owned();
        let every = self.spread_tick;
        async move {
            let dues: Arc<Vec<AtomicU64>> =
                Arc::new((0..total).map(|_| AtomicU64::new(0)).collect());
            // Bounded in flight: a producer that falls behind shows as a lower achieved
            // rate instead of an ever-growing queue of requests.
            let in_flight = Arc::new(Semaphore::new(PRODUCER_CALLS_IN_FLIGHT));
            let mut tasks = JoinSet::new();
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let started = Instant::now();
            let mut sent = 0u64;
            while sent < total {
                tick.tick().await;
                let target = ((started.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
                while sent < target {
                    let first = sent;
                    sent = target.min(first + PRODUCER_MAX_BATCH);
                    let items: Vec<BatchItem> = (first..sent)
                        .map(|n| {
                            let mut msg = template.clone();
                            msg.id = MessageId::parse(&format!("{prefix}{n}"))
                                .expect("bench ids are valid");
                            BatchItem::new(msg)
                        })
                        .collect();
                    let permit = in_flight.clone().acquire_owned().await?;
                    let store = store.clone();
                    let dues = dues.clone();
                    tasks.spawn(async move {
                        let outcomes = store.schedule_many(&items, max_delay, None).await;
                        drop(permit);
                        for (k, (item, outcome)) in items.iter().zip(outcomes).enumerate() {
                            match outcome? {
                                Scheduled::Scheduled { due_ms } => {
                                    dues[first as usize + k].store(due_ms, Ordering::Relaxed)
                                }
                                other => bail!("schedule {}: {other:?}", item.msg.id.as_str()),
                            }
                        }
                        Ok(())
                    });
                }
                while let Some(done) = tasks.try_join_next() {
                    done??;
                }
            }
            while let Some(done) = tasks.join_next().await {
                done??;
            }
            let achieved = total as f64 / started.elapsed().as_secs_f64();
            let dues = dues.iter().map(|d| d.load(Ordering::Relaxed)).collect();
            Ok((dues, achieved))
        }
    }

    /// Steps up `ladder` until a rate is not on time; every step is a row.
    pub async fn spread_search(
        &self,
        ladder: &[u64],
        duration: Duration,
    ) -> anyhow::Result<Vec<Spread>> {
        self.flush().await?;
        let mut rows: Vec<Spread> = Vec::new();
        for &rate in ladder {
            let row = self.spread(rate, duration).await?;
            let on_time = row.on_time;
            rows.push(row);
            if !on_time {
                break;
            }
        }
        // The rates with a target are measured even above the first late one.
        for (rate, _) in SPREAD_TARGETS {
            if ladder.contains(&rate) && !rows.iter().any(|r| r.rate_per_sec == rate) {
                rows.push(self.spread(rate, duration).await?);
            }
        }
        Ok(rows)
    }

    /// Backlog: `n` messages due in a day, then the spread scenario at each rate.
    pub async fn backlog(
        &self,
        n: u64,
        rates: &[u64],
        duration: Duration,
    ) -> anyhow::Result<Vec<Figures>> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let mem_before = memory::used_memory(&mut conn).await?;
        let (_, load_rate) = self
            .load(BACKLOG_STREAM, "f", n, Due::In(Duration::from_secs(86_400)))
            .await?;
        let bytes_per_pending = (memory::used_memory(&mut conn).await? - mem_before) / n as f64;
        let mut spreads = Vec::new();
        for &rate in rates {
            spreads.push(self.spread(rate, duration).await?);
        }
        let pending = self.pending().await?;
        Ok(spreads
            .into_iter()
            .map(|spread| {
                Delayq::BacklogSpread(Spread {
                    backlog: Some(Backlog {
                        backlog: n,
                        schedule_rate_per_sec: load_rate.round() as u64,
                        bytes_per_pending_message: bytes_per_pending.round() as i64,
                        backlog_still_pending: pending,
                    }),
                    ..spread
                })
                .into()
            })
            .collect())
    }
}
