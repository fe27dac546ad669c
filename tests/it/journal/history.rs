//! A message's journey in the journal's transition log, against MariaDB and real
//! daemons: each step in order with the node, the term and the token that made it,
//! through a leader's SIGKILL, with each redelivery's attempt and each dead letter's
//! reason; a push's step kept in its row until the row changes; a restore's step;
//! the log pruned past its retention.

use std::time::Duration;

use serde_json::{Value, json};

use super::daemon::{journaled, mariadb};
use delayq_harness::MariaDbServer;

use crate::support::{Api, create_group, delayq_bin, entries, eventually, read_group, xlen};

/// The steps of `id`'s history, as `step@node` (node "-" when none is said).
async fn steps(api: &Api, id: &str) -> (Vec<String>, Value) {
    let (status, body) = api.get(&format!("/v1/messages/{id}/history")).await;
    if status != 200 {
        return (Vec::new(), body);
    }
    let shown = body["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{}@{}",
                s["step"].as_str().unwrap(),
                s["node"].as_str().unwrap_or("-")
            )
        })
        .collect();
    (shown, body)
}

/// Whether `want` appears in `got` in order (other steps between them allowed).
fn in_order(got: &[String], want: &[String]) -> bool {
    let mut rest = got.iter();
    want.iter().all(|w| rest.any(|g| g == w))
}

/// Pushed and rescheduled over HTTP, forwarded by the first leader, which is then
/// SIGKILLed; redelivered twice and dead-lettered by the next one, replayed over
/// HTTP: the history tells each step in order, with the node that made it (the
/// first forward's line, copied by the next leader, still names the first), the
/// term of a leader's step and the token of an API's step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_s_journey_names_who_made_each_step_through_a_leader_kill() {
    let db = mariadb().await;
    let config = format!(
        "[journal]\nurl = \"{}\"\n\
         [delivery]\ngroups = [\"g\"]\nack_timeout = \"300ms\"\nsweep_interval = \"50ms\"\n\
         backoff = \"50ms\"\nbackoff_max = \"50ms\"\nbackoff_jitter = 0.0\nmax_attempts = 3\n[delivery.streams.s]\n",
        db.url_with_password()
    );
    let mut c = crate::support::Cluster::start(2, 1, &config).await;
    let (leader, first_epoch) = c.one_leader().wait(|| c.logs()).await;
    let standby = 1 - leader;
    let mut ids = Vec::new();
    for api in &c.apis {
        let (_, seen) = api.get("/v1/leader").await;
        ids.push(seen["node_id"].as_str().expect("a node id").to_owned());
    }
    let node_of = |i: usize| ids[i].clone();
    let mut conn = c.redis.client();
    create_group(&mut conn, "s", "g");
    let api = c.apis[standby]
        .clone()
        .with_timeout(Duration::from_secs(10));
    let body = json!({"stream": "s", "id": "trip", "payload": "x", "delay": "1h"});
    let (status, answer) = api.post("/v1/messages", body).await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = api
        .post("/v1/messages/trip/reschedule", json!({"delay_ms": 0}))
        .await;
    assert_eq!(status, 200, "{answer}");
    eventually(Duration::from_secs(10), "trip forwarded", || {
        let n = xlen(&mut conn, "s");
        async move { (n == 1).then_some(()) }
    })
    .await;
    c.nodes[leader].kill();
    let (next, second_epoch) = c
        .one_leader()
        .except(&[leader])
        .within(Duration::from_secs(30))
        .wait(|| c.logs())
        .await;
    assert!(second_epoch > first_epoch);
    // Read and never acknowledged: redelivered twice, then dead-lettered.
    eventually(Duration::from_secs(30), "trip dead-lettered", || {
        read_group(&mut conn, "s", "g", "c");
        let dead = entries(&mut conn, "s:dead").len();
        async move { (dead == 1).then_some(()) }
    })
    .await;
    let api = c.apis[next].clone().with_timeout(Duration::from_secs(10));
    let (status, answer) = api
        .post("/v1/streams/s/dead/replay", json!({"ids": ["trip"]}))
        .await;
    assert_eq!(status, 200, "{answer}");

    let (a, b) = (node_of(leader), node_of(next));
    let want: Vec<String> = [
        ("pushed", &node_of(standby)),
        ("rescheduled", &node_of(standby)),
        ("forwarded", &a),
        ("redelivered", &b),
        ("redelivered", &b),
        ("dead_lettered", &b),
        ("replayed", &b),
    ]
    .iter()
    .map(|(step, node)| format!("{step}@{node}"))
    .collect();
    let last = std::sync::Mutex::new(Value::Null);
    let got = eventually(
        Duration::from_secs(30),
        "the whole journey journaled",
        || async {
            let (got, body) = steps(&api, "trip").await;
            *last.lock().unwrap() = body;
            in_order(&got, &want).then_some(got)
        },
    )
    .await;
    let body = last.lock().unwrap().clone();
    let all = body["steps"].as_array().unwrap();
    // Oldest first; an API step names its token, a leader's its term and shard.
    let times: Vec<u64> = all.iter().map(|s| s["at"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{body}");
    for s in all {
        match s["step"].as_str().unwrap() {
            "pushed" | "rescheduled" | "replayed" => {
                assert_eq!(s["token"], "no token", "{s}")
            }
            "forwarded" | "redelivered" | "dead_lettered" => {
                let epoch = s["epoch"].as_u64().expect("a leader's step names its term");
                assert!(epoch == first_epoch || epoch == second_epoch, "{s}");
                assert!(s["shard"].as_u64().is_some(), "{s}");
            }
            _ => {}
        }
    }
    let forwarded = all.iter().find(|s| s["step"] == "forwarded").unwrap();
    assert_eq!(forwarded["epoch"], first_epoch, "{body}");
    assert!(forwarded["entry_id"].as_str().is_some(), "{body}");
    assert!(forwarded["lateness_ms"].as_u64().is_some(), "{body}");
    let pushed = all.iter().find(|s| s["step"] == "pushed").unwrap();
    assert_eq!(pushed["via"], "http", "{body}");
    // Each redelivery says its attempt and why; the dead letter why too.
    let again: Vec<(&Value, &Value)> = all
        .iter()
        .filter(|s| s["step"] == "redelivered")
        .map(|s| (&s["attempt"], &s["reason"]))
        .collect();
    assert_eq!(
        again,
        [
            (&json!(2), &json!("ack_timeout")),
            (&json!(3), &json!("ack_timeout"))
        ],
        "{body}"
    );
    let dead = all.iter().find(|s| s["step"] == "dead_lettered").unwrap();
    assert_eq!(dead["reason"], "max_attempts", "{body}");
    assert!(dead["entry_id"].as_str().is_some(), "{body}");
    println!("journey: {got:?}");
    docs_example_is_such_a_journey(all);

    // The command line tells the same.
    let out = tokio::process::Command::new(delayq_bin())
        .args(["history", "trip"])
        .env("DELAYQ_URL", c.apis[next].url("").trim_end_matches('/'))
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for step in [
        "pushed",
        "rescheduled",
        "forwarded",
        "redelivered",
        "dead_lettered",
        "replayed",
        "max_attempts",
    ] {
        assert!(text.contains(step), "{step}: {text}");
    }
    // Unknown ids, and none without a journal, are refused plainly.
    assert_eq!(api.get("/v1/messages/nobody/history").await.0, 404);
}

/// A restore after Redis lost its data adds a "restored" step, made by the leader
/// that restored it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_adds_its_step_and_the_log_is_pruned_past_its_retention() {
    let (db, redis, _node, api) = journaled().await;
    let mut conn = redis.client();
    let body = json!({"stream": "s", "id": "kept", "payload": "x", "delay": "1h"});
    assert_eq!(api.post("/v1/messages", body).await.0, 201);
    // The push's step is in its row, the log's table has none yet; the history
    // tells it all the same.
    assert_eq!(pushes_held(&db, "kept"), ("1\thttp".into(), "0".into()));
    assert_eq!(steps(&api, "kept").await.0, ["pushed@journaled"]);
    let () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    let got = eventually(Duration::from_secs(30), "the restore's step", || async {
        let (got, _) = steps(&api, "kept").await;
        got.iter()
            .any(|s| s.starts_with("restored@"))
            .then_some(got)
    })
    .await;
    assert!(got[0].starts_with("pushed@"), "{got:?}");

    // Pruning: steps older than the retention go, in batches; newer ones stay.
    let journal = delayq::journal::Journal::new(
        &delayq_client::config::Config::from_toml(
            &format!("[journal]\nurl = \"{}\"\n", db.url_with_password()),
            std::iter::empty(),
        )
        .unwrap()
        .journal
        .unwrap(),
    )
    .unwrap();
    let old = journal.history("kept").await.unwrap();
    let cut = old.last().unwrap().at_ms;
    assert_eq!(journal.trim_transitions(cut, 1).await.unwrap(), 1);
    let left = journal.history("kept").await.unwrap();
    assert_eq!(left.len(), old.len() - 1);
    // The push's step, still in its row (the message pending), went first.
    assert_eq!(old[0].step.as_str(), "pushed");
    assert_eq!(left[0].step.as_str(), "restored");
    assert_eq!(pushes_held(&db, "kept"), ("NULL\tNULL".into(), "0".into()));
    assert_eq!(
        journal.trim_transitions(cut + 1, 1000).await.unwrap(),
        left.len() as u64
    );
    assert!(journal.history("kept").await.unwrap().is_empty());
    assert_eq!(api.get("/v1/messages/kept/history").await.0, 404);
}

/// A push's step waits in its row; a replacing push and then a cancel each copy
/// the step the row holds into the log before writing their own: none is lost,
/// none told twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_s_step_moves_from_its_row_to_the_log_when_the_row_changes() {
    let (db, _redis, _node, api) = journaled().await;
    let push = |replace: bool| json!({"stream": "s", "id": "r", "payload": "x", "delay": "1h", "replace": replace});
    assert_eq!(api.post("/v1/messages", push(false)).await.0, 201);
    assert_eq!(pushes_held(&db, "r"), ("1\thttp".into(), "0".into()));
    let (status, body) = api.post("/v1/messages", push(true)).await;
    assert!(status == 200 || status == 201, "{status} {body}");
    assert_eq!(pushes_held(&db, "r"), ("2\thttp".into(), "1".into()));
    assert_eq!(api.delete("/v1/messages/r").await.0, 200);
    let want = [
        "pushed@journaled",
        "replaced@journaled",
        "cancelled@journaled",
    ];
    eventually(Duration::from_secs(10), "the cancel's step", || async {
        (steps(&api, "r").await.0 == want).then_some(())
    })
    .await;
    assert_eq!(pushes_held(&db, "r"), ("NULL\tNULL".into(), "2".into()));
}

/// docs/journal.md's example of `delayq history --json` says of each step only what
/// the same step of `real` (an answer of the API) says too.
fn docs_example_is_such_a_journey(real: &[Value]) {
    let doc = std::fs::read_to_string(crate::support::repo().join("docs/journal.md")).unwrap();
    let example = doc
        .split("```json\n")
        .skip(1)
        .filter_map(|block| block.split("\n```").next())
        .find(|block| block.contains("\"steps\""))
        .expect("docs/journal.md shows a history");
    let example: Value = serde_json::from_str(example).expect("the example is JSON");
    let steps = example["steps"].as_array().expect("its steps");
    assert!(steps.len() >= 3, "{example}");
    for step in steps {
        let name = &step["step"];
        let same = real
            .iter()
            .find(|s| &s["step"] == name)
            .unwrap_or_else(|| panic!("no {name} step in {real:?}"));
        for key in step.as_object().unwrap().keys() {
            assert!(
                same.get(key).is_some(),
                "docs/journal.md: {name} has {key}; the API's: {same}"
            );
        }
    }
}

/// A message its stream cannot take (the key holds a string) is dead-lettered, and
/// its history says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_s_step_says_why() {
    let (_db, redis, _node, api) = journaled().await;
    let () = redis::cmd("SET")
        .arg("w")
        .arg("not a stream")
        .query(&mut redis.client())
        .unwrap();
    let body = json!({"stream": "w", "id": "u", "payload": "x", "delay_ms": 0});
    assert_eq!(api.post("/v1/messages", body).await.0, 201);
    let dead = eventually(
        Duration::from_secs(10),
        "the dead letter's step",
        || async {
            let (_, body) = steps(&api, "u").await;
            body["steps"]
                .as_array()?
                .iter()
                .find(|s| s["step"] == "dead_lettered")
                .cloned()
        },
    )
    .await;
    assert_eq!(dead["reason"], "unwritable", "{dead}");
    assert!(dead["entry_id"].as_str().is_some(), "{dead}");
}

/// The push step `id`'s row holds ("step\thow", or "NULL\tNULL"), and how many
/// push steps the log's table has of it.
fn pushes_held(db: &MariaDbServer, id: &str) -> (String, String) {
    let held = db
        .sql(&format!(
            "SELECT came_step, came_how FROM delayq.delayq_messages WHERE id = '{id}'"
        ))
        .unwrap();
    let logged = db
        .sql(&format!(
            "SELECT COUNT(*) FROM delayq.delayq_transitions WHERE id = '{id}' AND step IN (1, 2)"
        ))
        .unwrap();
    (held.trim().to_owned(), logged.trim().to_owned())
}

/// The dashboard's message page shows the message's journey, oldest first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_message_page_shows_the_journey() {
    let db = mariadb().await;
    let config = format!("[journal]\nurl = \"{}\"\n", db.url_with_password());
    let c = crate::support::Cluster::start(1, 1, &config).await;
    c.one_leader().wait(|| c.logs()).await;
    let api = c.apis[0].clone().with_timeout(Duration::from_secs(10));
    let body = json!({"stream": "s", "id": "shown", "payload": "x", "delay": "1h"});
    assert_eq!(api.post("/v1/messages", body).await.0, 201);
    let (status, answer) = api
        .post("/v1/messages/shown/reschedule", json!({"delay_ms": 0}))
        .await;
    assert_eq!(status, 200, "{answer}");
    eventually(Duration::from_secs(30), "its forward journaled", || async {
        let (got, _) = steps(&api, "shown").await;
        got.iter()
            .any(|s| s.starts_with("forwarded@"))
            .then_some(())
    })
    .await;
    let browser = crate::support::browser::Browser::open(&api.url(""), "journey").await;
    browser.goto("/ui#/messages?id=shown").await;
    let text = browser
        .wait_text("#journey", "the journey", |t| {
            t.contains("pushed") && t.contains("rescheduled") && t.contains("forwarded")
        })
        .await;
    let at = |step: &str| text.find(step).unwrap();
    assert!(
        at("pushed") < at("rescheduled") && at("rescheduled") < at("forwarded"),
        "oldest first: {text}"
    );
    browser.screenshot("journey").await;
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "{errors:?}");
}
