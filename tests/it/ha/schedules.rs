//! Recurring schedules with real daemons: a schedule every second for a minute,
//! every occurrence exactly once and never early through a SIGKILL, a SIGSTOP and a
//! SIGTERM of the leader; and after every node was down for 30 s, exactly the
//! messages each misfire policy promises (an occurrence a dead leader pushed but did
//! not record counted as made, not missed).

use crate::support::now_ms;
use std::collections::BTreeMap;
use std::time::Duration;

use delayq_client::config::Config;
use delayq_client::message::{Due, MessageId, NewMessage};
use delayq_client::store::{ScheduleMode, Store};
use delayq_harness::{DelayqProcess, RedisServer};
use serde_json::json;

use crate::support::{Api, Cluster, delayq_bin, entries, eventually, within};

/// A schedule's delivered occurrences: occurrence ms → the entries' ms.
fn occurrences(redis: &RedisServer, stream: &str, schedule: &str) -> BTreeMap<i64, Vec<i64>> {
    let mut out: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for e in entries(&mut redis.client(), stream) {
        let id = e.get("delayq-id").unwrap_or_default();
        let Some(at) = id.strip_prefix(&format!("{schedule}.")) else {
            continue;
        };
        let at: i64 = at.parse().unwrap();
        let sent: i64 = e.id.split('-').next().unwrap().parse().unwrap();
        out.entry(at).or_default().push(sent);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_occurrence_once_and_never_early_through_kill_stop_and_term_of_the_leader() {
    let cluster = Cluster::start(3, 1, "[scheduler]\nhorizon = \"2s\"\n").await;
    let (leader, _) = cluster.one_leader().wait(|| cluster.logs()).await;
    let body = json!({ "id": "tick", "stream": "ticks", "payload": "t", "every": "1s" });
    let (status, answer) = cluster.apis[leader].post("/v1/schedules", body).await;
    assert_eq!(status, 201, "{answer}");
    let after = |n: usize| {
        let cluster = &cluster;
        async move {
            eventually(Duration::from_secs(30), "occurrences delivered", || async {
                (occurrences(&cluster.redis, "ticks", "tick").len() >= n).then_some(())
            })
            .await
        }
    };
    after(3).await;
    let mut down = Vec::new();
    for (signal, name) in [
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGSTOP, "SIGSTOP"),
        (libc::SIGTERM, "SIGTERM"),
    ] {
        let (old, epoch) = cluster
            .one_leader()
            .except(&down)
            .wait(|| cluster.logs())
            .await;
        cluster.nodes[old].signal(signal);
        down.push(old);
        let (next, _) = cluster
            .one_leader()
            .except(&down)
            .above(epoch)
            .within(Duration::from_secs(30))
            .wait(|| cluster.logs())
            .await;
        // Each failure some 15 s after the last.
        let seen = occurrences(&cluster.redis, "ticks", "tick").len();
        after(seen + 15).await;
        println!("{name} of n{old}: n{next} leads; {seen} occurrences before");
        if signal == libc::SIGSTOP {
            cluster.nodes[old].signal(libc::SIGCONT);
            down.pop();
        }
        if signal == libc::SIGTERM {
            break;
        }
    }
    // A minute of occurrences in all.
    after(60).await;
    let (leader, _) = cluster
        .one_leader()
        .except(&down)
        .wait(|| cluster.logs())
        .await;
    let (status, _) = cluster.apis[leader]
        .call("DELETE", "/v1/schedules/tick", None, None)
        .await;
    assert_eq!(status, 200);
    // What was made (up to the horizon) arrives; then nothing more.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let got = occurrences(&cluster.redis, "ticks", "tick");
    let ats: Vec<i64> = got.keys().copied().collect();
    assert!(ats.len() >= 60, "{ats:?}");
    let mut late: Vec<i64> = got.iter().map(|(at, sent)| sent[0] - at).collect();
    late.sort_unstable();
    println!(
        "{} occurrences; lateness p50 {} ms, p99 {} ms, max {} ms",
        late.len(),
        late[late.len() / 2],
        late[late.len() * 99 / 100],
        late[late.len() - 1]
    );
    for w in ats.windows(2) {
        assert_eq!(
            w[1] - w[0],
            1000,
            "an occurrence missed between {} and {}\n{}",
            w[0],
            w[1],
            cluster.logs()
        );
    }
    for (at, sent) in &got {
        assert_eq!(
            sent.len(),
            1,
            "occurrence {at} sent {} times: {sent:?}",
            sent.len()
        );
        assert!(sent[0] >= *at, "occurrence {at} sent early, at {}", sent[0]);
    }
}

/// Three schedules, one for each policy, every second; the only node is killed for
/// 30 s (longer than the horizon and the grace), then started again. The leader's
/// log says how many occurrences each missed; the stream then holds exactly what
/// the policy promises of them: `skip` none, `once` the latest, `all` the latest
/// `max_catch_up` (3), each sent once.
#[tokio::test]
async fn after_every_node_was_down_each_misfire_policy_sends_what_it_promises() {
    let redis = RedisServer::start().unwrap();
    let config = format!(
        "[redis]\nurl = \"{}\"\n[scheduler]\nhorizon = \"1s\"\n",
        redis.url()
    );
    let mut node = DelayqProcess::start(&delayq_bin(), "misfire", &config).unwrap();
    let api = Api::new(node.api);
    for (policy, catch_up) in [("skip", 10), ("once", 10), ("all", 3)] {
        let body = json!({ "id": policy, "stream": "ticks", "payload": policy, "every": "1s",
                           "misfire": policy, "max_catch_up": catch_up });
        let (status, answer) = api.post("/v1/schedules", body).await;
        assert_eq!(status, 201, "{answer}");
    }
    eventually(
        Duration::from_secs(10),
        "each schedule delivering",
        || async {
            ["skip", "once", "all"]
                .iter()
                .all(|p| occurrences(&redis, "ticks", p).len() >= 2)
                .then_some(())
        },
    )
    .await;
    node.kill();
    // What a SIGKILL between a round's pushes and its record leaves: each schedule's
    // next occurrence stored, how far it is made not moved on. That one is made,
    // delivered once and not counted as missed.
    let store = Store::connect(
        &Config::from_toml(&config, std::iter::empty())
            .unwrap()
            .store_config(),
    )
    .await
    .unwrap();
    let mut unrecorded = BTreeMap::new();
    for (spec, state) in store.schedule_specs().await.unwrap() {
        let at = state.expect("a state once delivering").next;
        let id = MessageId::parse(&format!("{}.{at}", spec.id)).unwrap();
        let msg = NewMessage::new(spec.stream, spec.fields, Due::At(at as u64)).with_id(id);
        store
            .schedule(&msg, ScheduleMode::New, Duration::from_secs(86400))
            .await
            .unwrap();
        unrecorded.insert(spec.id, at);
    }
    // Longer than the horizon (1 s) and the grace (5 s): occurrences are missed.
    tokio::time::sleep(Duration::from_secs(30)).await;
    node.restart().unwrap();
    let started_at = now_ms() as i64;
    let api = Api::new(node.api);
    // Each policy's decision, as the leader logs it (its rules are plan.rs's unit
    // tests); then every schedule delivers again, nothing twice.
    let mut decided = Vec::new();
    for (policy, sent) in [("skip", 0), ("once", 1), ("all", 3)] {
        let named = [
            format!("schedule={policy} "),
            format!("schedule=\"{policy}\""),
        ];
        let line = within(Duration::from_secs(20), || async {
            node.log()
                .lines()
                .find(|l| {
                    l.contains("missed occurrences") && named.iter().any(|n| l.contains(n.as_str()))
                })
                .map(str::to_owned)
        })
        .await
        .unwrap_or_else(|| panic!("{policy}: no misfire decision logged:\n{}", node.log()));
        assert!(line.contains(&format!(" sent={sent} ")), "{policy}: {line}");
        let missed: usize = line
            .split(" missed=")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(
            missed >= 20,
            "{policy}: a 30 s outage misses some 24: {line}"
        );
        decided.push((policy, missed, sent));
    }
    eventually(
        Duration::from_secs(20),
        "each schedule delivering again",
        || async {
            ["skip", "once", "all"]
                .iter()
                .all(|p| {
                    occurrences(&redis, "ticks", p)
                        .keys()
                        .any(|&at| at > started_at)
                })
                .then_some(())
        },
    )
    .await;
    for &(policy, missed, _) in &decided {
        let (_, shown) = api.get(&format!("/v1/schedules/{policy}")).await;
        assert_eq!(shown["missed"], json!(missed), "{shown}");
        let (status, _) = api
            .call("DELETE", &format!("/v1/schedules/{policy}"), None, None)
            .await;
        assert_eq!(status, 200);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for &(p, missed, sent) in &decided {
        let got = occurrences(&redis, "ticks", p);
        assert!(got.contains_key(&unrecorded[p]), "{p}: {got:?}");
        assert!(
            got.values().all(|sent| sent.len() == 1),
            "{p}: an occurrence twice: {got:?}"
        );
        // One run of absent occurrences, the missed ones the policy does not send;
        // right after it, the ones it sends, late by more than the grace.
        let ats: Vec<i64> = got.keys().copied().collect();
        let gaps: Vec<(i64, i64)> = ats
            .windows(2)
            .filter(|w| w[1] - w[0] != 1000)
            .map(|w| (w[0], w[1]))
            .collect();
        assert_eq!(gaps.len(), 1, "{p}: one run missed: {ats:?}");
        let (before, after) = gaps[0];
        assert_eq!(
            ((after - before) / 1000 - 1) as usize,
            missed - sent,
            "{p}: missed {missed}, sent {sent}: {ats:?}"
        );
        for at in (0..sent).map(|i| after + 1000 * i as i64) {
            let late = got[&at][0] - at;
            assert!(
                late > 5000,
                "{p}: {at} sent for a missed occurrence, {late} ms late"
            );
        }
        assert!(
            got.iter().all(|(at, sent)| sent[0] >= *at),
            "{p}: an occurrence early: {got:?}"
        );
    }
    // The same counts, per schedule, in the metrics and the API.
    let text = api.metrics().await.unwrap();
    let counted = |name: &str, policy: &str| -> usize {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{schedule=\"{policy}\"}} ")))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(-1.0) as usize
    };
    for (policy, missed, sent) in &decided {
        assert_eq!(
            counted("delayq_schedule_missed_total", policy),
            *missed,
            "{text}"
        );
        assert_eq!(
            counted("delayq_schedule_skipped_total", policy),
            missed - sent,
            "{text}"
        );
    }
}
