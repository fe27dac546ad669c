//! The log through a Redis outage: one line per condition, with a count, at a
//! slowing rate, not one per shard and retry; and one line when it is over. A real
//! daemon process with 16 shards, its log read from its stderr.

use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisOptions, RedisServer};

use crate::support::{Api, Deliveries, delayq_bin, eventually, let_pass};

const SHARDS: u16 = 16;
const OUTAGE: Duration = Duration::from_secs(5);
const STREAM: &str = "logged";

/// The lines of `log` at `level` from `target` (a module: `delayq::leader::forwarder`).
fn lines<'l>(log: &'l str, level: &str, target: &str) -> Vec<&'l str> {
    let mark = format!(" {level} {target}");
    log.lines().filter(|l| l.contains(&mark)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_is_logged_in_a_few_lines_and_its_end_in_one() {
    let mut redis = RedisServer::start_with(RedisOptions {
        aof: true,
        ..RedisOptions::default()
    })
    .expect("start redis");
    let node = DelayqProcess::start(
        &delayq_bin(),
        "logs",
        &format!("[redis]\nurl = \"{}\"\nshards = {SHARDS}\n", redis.url()),
    )
    .expect("start delayq");
    let api = Api::new(node.api);
    let deliveries = Deliveries::new(&redis.url(), &[STREAM]);
    // Forwarding before the outage.
    api.schedule("warm-up", STREAM, 0).await;
    eventually(Duration::from_secs(10), "the first delivery", || {
        std::future::ready(deliveries.len().filter(|n| *n == 1))
    })
    .await;
    // Messages falling due during the outage, over every shard (AOF: Redis keeps them).
    let ids: Vec<String> = (0..64).map(|i| format!("due-in-outage-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        api.schedule(id, STREAM, 1000 + (i as u64 % 8) * 250).await;
    }

    let before = node.full_log().len();
    redis.kill();
    let_pass(OUTAGE).await;
    redis.restart().expect("restart redis");
    eventually(Duration::from_secs(20), "forwarding works again", || {
        let log = node.full_log();
        std::future::ready(
            log[before..]
                .contains("forwarding works again")
                .then_some(()),
        )
    })
    .await;
    // Everything scheduled before the outage arrives, once.
    let expected = ids.iter().map(String::as_str).chain(["warm-up"]);
    let (tally, _) = deliveries
        .exactly_once(expected, Duration::from_secs(20))
        .await;
    tally.assert_exact(&node.log());

    let log = node.full_log()[before..].to_owned();
    let warned = lines(&log, "WARN", "delayq");
    let shown = warned.join("\n");
    // 16 shard loops retrying every 20 ms to 2 s logged over 100 lines in 5 s; now
    // the first failure, then summaries after 1 s, 2 s, 4 s (and the wake-ups' own).
    let forwarding = lines(&log, "WARN", "delayq::leader::forwarder");
    assert!(
        forwarding.len() <= 10,
        "{} WARN lines from the forwarder:\n{shown}",
        forwarding.len()
    );
    let failed: Vec<&str> = forwarding
        .iter()
        .copied()
        .filter(|l| l.contains("forward failed"))
        .collect();
    assert!(
        failed.first().is_some_and(|l| l.contains("shard=")),
        "the first failure, with its shard:\n{shown}"
    );
    assert!(
        failed.iter().skip(1).all(|l| l.contains(" in the last ")),
        "then summaries:\n{shown}"
    );
    // Every other loop too (inbox, health, sweeps, ...): no flood.
    assert!(warned.len() <= 30, "{} WARN lines:\n{shown}", warned.len());
    let recovered: Vec<&str> = lines(&log, "INFO", "delayq::leader::forwarder")
        .into_iter()
        .filter(|l| l.contains("forwarding works again after"))
        .collect();
    assert_eq!(recovered.len(), 1, "one recovery line:\n{log}");
    assert!(recovered[0].contains(" failures over "), "{}", recovered[0]);
}
