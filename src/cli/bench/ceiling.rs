//! The ceiling: what this Redis does for the same work without delayq. A minimal
//! Lua script (`ceiling.lua`: ZRANGEBYSCORE, HMGET, XADD, HDEL, ZREM for a batch)
//! called in a loop straight from here, and `redis-benchmark` for plain XADD and ZADD.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use redis::{AsyncCommands, Script};

use super::Bench;
use super::measure::{self, CpuMeter, PingProbe, measured, tally_stream};
use super::rows::{Ceiling, CeilingBurst, Figures, Reference, ReferenceResults};

const DUE: &str = "ceiling:due";
const BODIES: &str = "ceiling:msg";
const STREAM: &str = "ceiling:stream";
/// Script calls in flight: enough that Redis never waits for the next one.
pub const CALLERS: usize = 4;

impl Bench {
    /// Moves `n` due messages with `ceiling.lua`, batches of `batch_size`.
    pub async fn ceiling(&self, n: u64) -> anyhow::Result<Figures> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let now = self.store.now_ms().await?;
        let mut start = 0;
        while start < n {
            let end = (start + 1000).min(n);
            let mut pipe = redis::pipe();
            let zadd = pipe.cmd("ZADD").arg(DUE);
            for i in start..end {
                zadd.arg(now).arg(format!("c{i}"));
            }
            pipe.ignore();
            let hset = pipe.cmd("HSET").arg(BODIES);
            for i in start..end {
                hset.arg(format!("c{i}")).arg(&self.payload);
            }
            pipe.ignore();
            let () = pipe.query_async(&mut conn).await?;
            start = end;
        }

        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let meter = CpuMeter::start(&mut conn, None).await?;
        let script = Script::new(include_str!("ceiling.lua"));
        let started = Instant::now();
        let mut callers = tokio::task::JoinSet::new();
        for _ in 0..CALLERS {
            let mut conn = conn.clone();
            let script = script.clone();
            let batch = self.batch_size;
            callers.spawn(async move {
                loop {
                    let moved: u64 = script
                        .key(DUE)
                        .key(BODIES)
                        .key(STREAM)
                        .arg(batch)
                        .invoke_async(&mut conn)
                        .await?;
                    if moved == 0 {
                        return anyhow::Ok(());
                    }
                }
            });
        }
        while let Some(done) = callers.join_next().await {
            done??;
        }
        let secs = started.elapsed().as_secs_f64();
        let cpu = meter.stop(&mut conn, n).await?;
        let probe = probe.finish()?;
        let tally = tally_stream(&mut conn, STREAM, "c", n, |_| now).await?;
        Ok(Ceiling::Burst(CeilingBurst {
            measured: measured(
                n,
                load,
                (n as f64 / secs).round() as u64,
                &cpu,
                None,
                &probe,
                tally.counts(),
            ),
            drain_ms: (secs * 1000.0).round() as u64,
        })
        .into())
    }

    /// `redis-benchmark` for XADD (with the bench payload) and ZADD, without and
    /// with pipelining (16 commands), 50 connections, `n` requests each; `run` is
    /// the run it belongs to.
    pub async fn redis_benchmark(&self, n: u64, run: u32) -> anyhow::Result<Reference> {
        self.flush().await?;
        let load = measure::load_average();
        // XADD, XADD pipelined, ZADD, ZADD pipelined.
        let mut results = Vec::new();
        let cases = [
            vec!["XADD", "rb:stream", "*", "payload", &self.payload],
            vec!["ZADD", "rb:zset", "__rand_int__", "m:__rand_int__"],
        ];
        for command in cases {
            for pipeline in [1, 16] {
                let output = tokio::time::timeout(
                    Duration::from_secs(120),
                    tokio::process::Command::new("redis-benchmark")
                        .args(["-h", &self.host, "-p", &self.port.to_string()])
                        .args([
                            "-c",
                            "50",
                            "-n",
                            &n.to_string(),
                            "-P",
                            &pipeline.to_string(),
                        ])
                        .args(["-r", "1000000", "--csv"])
                        .args(&command)
                        .kill_on_drop(true)
                        .output(),
                )
                .await
                .context("redis-benchmark took over 120s")?
                .context("run redis-benchmark (it comes with redis-server)")?;
                if !output.status.success() {
                    bail!(
                        "redis-benchmark failed: {}",
                        String::from_utf8_lossy(&output.stderr)
                    );
                }
                let stdout = String::from_utf8_lossy(&output.stdout);
                results.push(requests_per_sec(&stdout)?.round() as u64);
            }
        }
        let mut conn = self.conn.clone();
        let _: u64 = conn.del(&["rb:stream", "rb:zset"]).await?;
        let [
            xadd_p1_per_sec,
            xadd_p16_per_sec,
            zadd_p1_per_sec,
            zadd_p16_per_sec,
        ] = results[..]
        else {
            bail!("redis-benchmark: {} results for 4 cases", results.len());
        };
        Ok(Reference {
            requests: n,
            load_average: load,
            results: ReferenceResults {
                xadd_p1_per_sec,
                xadd_p16_per_sec,
                zadd_p1_per_sec,
                zadd_p16_per_sec,
            },
            run,
        })
    }
}

/// The "rps" column of redis-benchmark's `--csv` output (one test).
fn requests_per_sec(csv: &str) -> anyhow::Result<f64> {
    let row = csv
        .lines()
        .find(|l| !l.starts_with("\"test\"") && l.contains(','))
        .with_context(|| format!("no result in redis-benchmark output: {csv}"))?;
    // Fields are quoted; the test name may hold commas but never `","`.
    let rps = row.split("\",\"").nth(1).unwrap_or("").trim_matches('"');
    rps.parse()
        .with_context(|| format!("redis-benchmark rps {rps:?} in {row:?}"))
}

#[cfg(test)]
mod tests {
    use super::requests_per_sec;

    #[track_caller]
    fn check(csv: &str, expected: f64) {
        assert_eq!(requests_per_sec(csv).unwrap(), expected);
    }

    #[test]
    fn reads_the_rps_column() {
        check(
            "\"test\",\"rps\",\"avg_latency_ms\"\n\"XADD rb:s * payload xx\",\"307692.31\",\"2.348\"\n",
            307692.31,
        );
        check("\"ZADD a,b\",\"40160.64\",\"0.841\"\n", 40160.64);
    }
}
