//! The dashboard's endpoints against a real cluster: what they show on the leader
//! and on a standby, pausing and resuming a stream, switchover, reload, scopes,
//! bad input; and the page's own files.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use delayq_harness::{DelayqProcess, RedisServer, free_port};
use serde_json::{Value, json};

use crate::support::{
    Api, Cluster, create_group, delayq_bin, entries, eventually, stream_row, xlen,
};

pub(super) const ADMIN: &str = "board-admin-token";
pub(super) const READER: &str = "board-read-token";

pub(super) fn tokens() -> String {
    format!("[api]\ntokens = [\"{ADMIN}\"]\nread_tokens = [\"{READER}\"]\n")
}

pub(super) async fn push(cluster: &Cluster, node: usize, id: &str, stream: &str, delay_ms: u64) {
    let api = cluster.apis[node].clone().with_token(ADMIN);
    api.schedule(id, stream, delay_ms).await;
}

pub(super) async fn get(cluster: &Cluster, node: usize, path: &str) -> Value {
    let (status, body) = cluster.apis[node]
        .clone()
        .with_token(READER)
        .get(path)
        .await;
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_and_standby_show_the_same_deployment() {
    let cluster = Cluster::start(2, 1, &tokens()).await;
    for (id, delay) in [
        ("soon-1", 20_000),
        ("soon-2", 30_000),
        ("hour-1", 1_800_000),
        ("day-1", 7_200_000),
        ("later-1", 3 * 86_400_000),
    ] {
        push(&cluster, 1, id, "orders", delay).await;
    }
    push(&cluster, 0, "mail-1", "emails", 40_000).await;
    for node in 0..2 {
        let o = get(&cluster, node, "/v1/overview").await;
        assert_eq!(o["leader"]["node_id"], "n0", "{o}");
        assert_eq!(o["node"]["is_leader"], node == 0, "{o}");
        assert_eq!(o["pending"]["total"], 6, "{o}");
        let due = &o["due"];
        assert_eq!(
            [
                &due["overdue"],
                &due["next_minute"],
                &due["next_hour"],
                &due["next_day"],
                &due["later"]
            ],
            [&json!(0), &json!(3), &json!(1), &json!(1), &json!(1)],
            "{o}"
        );
        assert_eq!(o["fence"], o["leader"]["epoch"], "{o}");
        assert_eq!(o["redis"]["status"], "writable", "{o}");
        assert_eq!(o["etcd"]["status"], "reachable", "{o}");

        let nodes = eventually(Duration::from_secs(10), "both nodes registered", || async {
            let n = get(&cluster, node, "/v1/nodes").await;
            let roles: Vec<(String, String)> = n["nodes"]
                .as_array()?
                .iter()
                .map(|n| {
                    (
                        n["node_id"].as_str().unwrap().to_owned(),
                        n["role"].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
            (roles.len() == 2).then_some(roles)
        })
        .await;
        assert_eq!(
            nodes,
            [
                ("n0".into(), "leader".into()),
                ("n1".into(), "standby".into())
            ]
        );

        // The next due, in pages of two, in due order.
        let first = get(&cluster, node, "/v1/upcoming?limit=2").await;
        let ids = |page: &Value| -> Vec<String> {
            page["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(ids(&first), ["soon-1", "soon-2"], "{first}");
        let next = first["next"].as_str().expect("a next page").to_owned();
        let second = get(
            &cluster,
            node,
            &format!("/v1/upcoming?limit=2&after={next}"),
        )
        .await;
        assert_eq!(ids(&second), ["mail-1", "hour-1"], "{second}");
        let orders = get(&cluster, node, "/v1/upcoming?limit=10&stream=orders").await;
        assert_eq!(
            ids(&orders),
            ["soon-1", "soon-2", "hour-1", "day-1", "later-1"],
            "{orders}"
        );
        assert_eq!(orders["next"], Value::Null, "{orders}");

        // Counted by the leader every 2 s at this size, and kept for 5 s per node.
        let orders = eventually(Duration::from_secs(15), "orders counted", || async {
            let streams = get(&cluster, node, "/v1/streams").await;
            let orders = stream_row(&streams, "orders")?;
            (orders["pending"] == 5 && streams["counted_at_ms"].is_u64()).then_some(orders)
        })
        .await;
        assert_eq!(orders["due_next_hour"], 3, "{orders}");
        assert_eq!(orders["dead_letter_stream"], "orders:dead");

        let history = get(&cluster, node, "/v1/leadership/history").await;
        let newest = &history["terms"][0];
        assert_eq!(
            (&newest["node_id"], &newest["to_ms"]),
            (&json!("n0"), &Value::Null),
            "{history}"
        );
        let fences = get(&cluster, node, "/v1/fences").await;
        assert_eq!(fences["highest"], o["fence"], "{fences}");
        assert_eq!(
            fences["shards"].as_array().map(Vec::len),
            Some(2),
            "{fences}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_scopes_are_refused_with_a_reason() {
    let cluster = Cluster::start(1, 1, &tokens()).await;
    let reader = cluster.apis[0].clone().with_token(READER);
    let admin = cluster.apis[0].clone().with_token(ADMIN);
    for (path, code) in [
        ("/v1/upcoming?limit=0", 422),
        ("/v1/upcoming?limit=1001", 422),
        ("/v1/upcoming?limit=x", 400),
        ("/v1/upcoming?after=nonsense", 422),
        ("/v1/upcoming?after=12-", 422),
        ("/v1/upcoming?stream=a%20b", 422),
    ] {
        let (status, body) = reader.get(path).await;
        assert_eq!(status, code, "GET {path}: {body}");
        assert!(
            body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{body}"
        );
    }
    let long = "s".repeat(300);
    for (path, code) in [
        (format!("/v1/streams/{long}/pause"), 422),
        ("/v1/streams/a%20b/resume".to_owned(), 422),
    ] {
        let (status, body) = admin.post(&path, json!({})).await;
        assert_eq!(status, code, "POST {path}: {body}");
        assert!(
            body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("stream")),
            "{body}"
        );
    }
    let (status, body) = reader.get("/v1/session").await;
    assert_eq!((status, &body["scope"]), (200, &json!("read")), "{body}");
    assert_eq!(admin.get("/v1/session").await.1["scope"], "admin");
    for path in [
        "/v1/streams/orders/pause",
        "/v1/streams/orders/resume",
        "/v1/admin/reload",
        "/v1/admin/switchover",
    ] {
        let (status, body) = reader.post(path, json!({})).await;
        assert_eq!(
            (status, &body["error"]),
            (403, &json!("insufficient_scope")),
            "POST {path}: {body}"
        );
    }
    let (status, _) = cluster.apis[0].get("/v1/overview").await;
    assert_eq!(status, 401);
    // The session is open: it says a token is needed, and whether the one given is known.
    let (status, body) = cluster.apis[0].get("/v1/session").await;
    assert_eq!(
        (status, &body["scope"], &body["tokens_required"]),
        (200, &Value::Null, &json!(true)),
        "{body}"
    );
    let (_, body) = cluster.apis[0]
        .clone()
        .with_token("not-a-token")
        .get("/v1/session")
        .await;
    assert_eq!(body["scope"], Value::Null, "{body}");
    for (body, code) in [
        (json!({ "to": "nobody" }), 404),
        (json!({ "to": "n0" }), 409),
        (json!({}), 409),
        (json!({ "to": 7 }), 422),
        (json!({ "towards": "n0" }), 422),
    ] {
        let (status, answer) = admin.post("/v1/admin/switchover", body.clone()).await;
        assert_eq!(status, code, "switchover {body}: {answer}");
    }
    // The page is open, with a policy that allows nothing from elsewhere.
    for (path, kind) in [
        ("/ui", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let response = cluster.apis[0].request("GET", path).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert!(
            headers["content-type"].to_str().unwrap().starts_with(kind),
            "{path}: {headers:?}"
        );
        assert!(
            headers["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("default-src 'self'")
        );
        assert!(!response.text().await.unwrap().is_empty());
    }
}

/// A pause is in force once answered: messages due at once, pushed right after it,
/// all wait (every forward call reads the paused set itself on one Redis; before,
/// the leader read it every 250 ms and most of them went out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_is_in_force_as_soon_as_it_is_answered() {
    let cluster = Cluster::start(1, 1, &format!("{}[redis]\nshards = 4\n", tokens())).await;
    let admin = cluster.apis[0].clone().with_token(ADMIN);
    push(&cluster, 0, "before", "orders", 0).await;
    eventually(Duration::from_secs(10), "the leader forwarding", || async {
        (xlen(&mut cluster.redis.client(), "orders") == 1).then_some(())
    })
    .await;
    let (status, body) = admin.post("/v1/streams/orders/pause", json!({})).await;
    assert_eq!(status, 200, "{body}");
    for i in 0..40 {
        push(&cluster, 0, &format!("o-{i:02}"), "orders", 0).await;
    }
    eventually(Duration::from_secs(10), "all forty held", || async {
        let s = get(&cluster, 0, "/v1/streams").await;
        let o = stream_row(&s, "orders")?;
        (o["held"] == 40).then_some(())
    })
    .await;
    assert_eq!(
        xlen(&mut cluster.redis.client(), "orders"),
        1,
        "nothing pushed after the pause's answer went out"
    );
    let (status, body) = admin.post("/v1/streams/orders/resume", json!({})).await;
    assert_eq!(status, 200, "{body}");
    eventually(
        Duration::from_secs(10),
        "all delivered once resumed",
        || async { (xlen(&mut cluster.redis.client(), "orders") == 41).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_stream_waits_and_resuming_delivers_each_once_in_due_order() {
    // One shard: a backlog drains in due order shard by shard, so one shard shows
    // the whole order.
    let cluster = Cluster::start(
        1,
        1,
        &format!(
            "{}[redis]\nshards = 1\n[streams.max_rate]\nmail-out = 50\n",
            tokens()
        ),
    )
    .await;
    let admin = cluster.apis[0].clone().with_token(ADMIN);
    let mut conn = cluster.redis.client();
    create_group(&mut conn, "orders", "workers");
    let (status, body) = admin.post("/v1/streams/orders/pause", json!({})).await;
    assert_eq!(
        (status, &body["paused"], &body["changed"]),
        (200, &json!(true), &json!(true)),
        "{body}"
    );
    for i in 0..20 {
        push(&cluster, 0, &format!("o-{i:02}"), "orders", 300 + i * 10).await;
    }
    for i in 0..5 {
        push(&cluster, 0, &format!("e-{i}"), "emails", 300).await;
    }
    eventually(
        Duration::from_secs(10),
        "emails delivered while orders waits",
        || async { (xlen(&mut cluster.redis.client(), "emails") == 5).then_some(()) },
    )
    .await;
    let held = eventually(Duration::from_secs(10), "orders held", || async {
        let s = get(&cluster, 0, "/v1/streams").await;
        let o = stream_row(&s, "orders")?;
        (o["held"] == 20).then_some(o)
    })
    .await;
    assert_eq!(
        (&held["paused"], &held["groups"][0]["name"]),
        (&json!(true), &json!("workers")),
        "{held}"
    );
    // The emails' deliveries in the minutes of the last hour (from the leader's
    // samples, every 5 s); a stream with a limit of its own shows it.
    let emails = eventually(Duration::from_secs(15), "emails' last hour", || async {
        let s = get(&cluster, 0, "/v1/streams").await;
        let e = stream_row(&s, "emails")?;
        let minutes: Vec<u64> = e["delivered_last_hour"]
            .as_array()?
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        (minutes.len() == 60 && minutes.iter().sum::<u64>() == 5).then_some(s)
    })
    .await;
    let limited = emails["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stream"] == "mail-out")
        .cloned()
        .unwrap_or_default();
    assert_eq!(limited["max_rate"], 50, "{emails}");
    assert_eq!(held.get("max_rate"), None, "{held}");
    assert_eq!(
        xlen(&mut conn, "orders"),
        0,
        "nothing reaches a paused stream"
    );
    let upcoming = get(&cluster, 0, "/v1/upcoming?stream=orders&limit=100").await;
    let listed = upcoming["messages"].as_array().unwrap();
    assert_eq!(listed.len(), 20, "{upcoming}");
    assert!(listed.iter().all(|m| m["held"] == true), "{upcoming}");

    let (status, body) = admin.post("/v1/streams/orders/resume", json!({})).await;
    assert_eq!((status, &body["paused"]), (200, &json!(false)), "{body}");
    eventually(
        Duration::from_secs(10),
        "orders delivered after resume",
        || async { (xlen(&mut cluster.redis.client(), "orders") >= 20).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got: Vec<String> = entries(&mut conn, "orders")
        .iter()
        .map(|e| e.get("delayq-id").unwrap().to_owned())
        .collect();
    let want: Vec<String> = (0..20).map(|i| format!("o-{i:02}")).collect();
    assert_eq!(got, want, "each once, in due order");
    // The held ones' wait is counted apart from the lateness: the emails alone are
    // in that.
    let text = cluster.apis[0].metrics().await.unwrap();
    let count = |name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}_count ")))
            .and_then(|v| v.parse().ok())
    };
    assert_eq!(
        (
            count("delayq_forward_held_wait_seconds"),
            count("delayq_forward_lateness_seconds")
        ),
        (Some(20.0), Some(5.0)),
        "{text}"
    );
    // The CLI speaks to the same endpoints.
    for (cmd, paused) in [("pause", true), ("resume", false)] {
        let out = std::process::Command::new(delayq_bin())
            .args([
                cmd,
                "emails",
                "--url",
                &cluster.apis[0].url(""),
                "--token",
                ADMIN,
                "--json",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "delayq {cmd}: {out:?}");
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(answer["paused"], paused, "{answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_asked_while_no_node_leads_waits_for_one_then_is_refused() {
    // Its etcd never answers, so this node never learns of a leader.
    let redis = RedisServer::start().unwrap();
    let config = format!(
        "[redis]\nurl = \"{}\"\n[etcd]\nendpoints = [\"http://127.0.0.1:{}\"]\n{}",
        redis.url(),
        free_port(),
        tokens()
    );
    let node = DelayqProcess::start(&delayq_bin(), "n0", &config).unwrap();
    let admin = Api::new(node.api)
        .with_token(ADMIN)
        .with_timeout(Duration::from_secs(15));
    eventually(Duration::from_secs(10), "the node answers", || async {
        (admin.get("/v1/leader").await.0 == 200).then_some(())
    })
    .await;
    let asked = Instant::now();
    let (status, body) = admin.post("/v1/admin/switchover", json!({})).await;
    assert_eq!(
        (status, body["detail"].as_str()),
        (409, Some("no node leads now")),
        "{body}\n{}",
        node.log()
    );
    assert!(
        asked.elapsed() >= Duration::from_secs(3),
        "refused after {:?}, without waiting for a leader to be named",
        asked.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchover_hands_leadership_to_the_chosen_node_and_history_says_so() {
    let cluster = Cluster::start(3, 1, &tokens()).await;
    // Every node registered before choosing one.
    eventually(
        Duration::from_secs(10),
        "three nodes registered",
        || async {
            let n = get(&cluster, 0, "/v1/nodes").await;
            (n["nodes"].as_array()?.len() == 3).then_some(())
        },
    )
    .await;
    let admin = cluster.apis[1]
        .clone()
        .with_token(ADMIN)
        .with_timeout(Duration::from_secs(15));
    let (status, body) = admin
        .post("/v1/admin/switchover", json!({ "to": "n2" }))
        .await;
    assert_eq!(
        (status, &body["from"], &body["to"]),
        (200, &json!("n0"), &json!("n2")),
        "{body}\n{}",
        cluster.logs()
    );
    eprintln!("switchover n0 → n2 took {} ms", body["took_ms"]);
    let (leader, _) = cluster.one_leader().wait(|| cluster.logs()).await;
    assert_eq!(leader, 2);
    // Again, from the CLI, to the node that stood aside.
    let out = std::process::Command::new(delayq_bin())
        .args([
            "switchover",
            "--to",
            "n1",
            "--url",
            &cluster.apis[0].url(""),
            "--token",
            ADMIN,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "delayq switchover: {out:?}\n{}",
        cluster.logs()
    );
    let (leader, _) = cluster.one_leader().wait(|| cluster.logs()).await;
    assert_eq!(leader, 1);
    let history = get(&cluster, 0, "/v1/leadership/history").await;
    let terms: Vec<(String, Option<String>)> = history["terms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["node_id"].as_str().unwrap().to_owned(),
                t["ended"].as_str().map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(
        terms[..3],
        [
            ("n1".into(), None),
            ("n2".into(), Some("switchover".into())),
            ("n0".into(), Some("switchover".into()))
        ],
        "{history}"
    );
    // A node that stops says so: it shows as gone at once.
    let mut cluster = cluster;
    cluster.nodes[0].terminate(Duration::from_secs(10));
    let roles = get(&cluster, 1, "/v1/nodes").await;
    let n0 = roles["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == "n0")
        .cloned();
    assert_eq!(
        n0.map(|n| n["role"].clone()),
        Some(json!("gone")),
        "{roles}"
    );
    // With no other standby to wait for, the leader hands over at once, maybe before
    // the chosen node has read the switchover key itself: it still ends the
    // switchover when it leads, so the node that stood aside campaigns again and a
    // crash of the new leader is taken over as usual.
    let (status, body) = admin
        .post("/v1/admin/switchover", json!({ "to": "n2" }))
        .await;
    assert_eq!(status, 200, "{body}\n{}", cluster.logs());
    eventually(
        Duration::from_secs(5),
        "the switchover key cleared",
        || async {
            cluster
                .store
                .switchover_target()
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    cluster.nodes[2].kill();
    let (leader, _) = cluster.one_leader().wait(|| cluster.logs()).await;
    assert_eq!(leader, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_over_http_applies_the_file_and_names_what_waits_for_a_restart() {
    let cluster = Cluster::start(1, 1, &tokens()).await;
    let admin = cluster.apis[0].clone().with_token(ADMIN);
    let path = cluster.nodes[0].config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}\n[log]\nlevel = \"debug\"\n")).unwrap();
    let (status, body) = admin.post("/v1/admin/reload", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["changed"], json!(["log.level"]), "{body}");
    std::fs::write(&path, format!("{text}\n[log]\nlevel = 5\n")).unwrap();
    let (status, body) = admin.post("/v1/admin/reload", json!({})).await;
    assert_eq!(status, 422, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("{}: log.level", path.display())),
        "{body}"
    );
    // A file that cannot be read is named with why.
    std::fs::remove_file(&path).unwrap();
    let (status, body) = admin.post("/v1/admin/reload", json!({})).await;
    assert_eq!(status, 422, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("{}: cannot read it: ", path.display())),
        "{body}"
    );
    // A crashed node shows as gone, and its open term as ended with it.
    let names: BTreeSet<String> = get(&cluster, 0, "/v1/nodes").await["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, BTreeSet::from(["n0".to_owned()]));
}
