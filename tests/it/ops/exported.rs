//! What `/metrics` shows an operator: bounded label values, help text on every
//! metric, the gauges alerts are built on. Real processes throughout.

use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};
use futures::StreamExt;
use rand::{Rng, SeedableRng};

use serde_json::json;

use delayq::metrics::{Kind, METRICS, Start, known_series};
use delayq_client::config::Config;

use crate::support::{
    Api, Cluster, delayq_bin, documented_metrics, etcd_config, eventually, redis_config, series,
    value, xlen,
};

/// A standalone node (no etcd) on its own Redis.
fn standalone(name: &str, redis: &RedisServer, extra: &str) -> DelayqProcess {
    DelayqProcess::start(
        &delayq_bin(),
        name,
        &format!("[redis]\nurl = \"{}\"\nshards = 2\n{extra}", redis.url()),
    )
    .unwrap()
}

/// Sends one request with any method; the answer does not matter here.
async fn send(api: &Api, method: &str, path: &str) {
    api.send(method, path, None, None).await.expect("an answer");
}

/// A method token: sometimes a known method, sometimes one in the wrong case,
/// mostly made up.
fn random_method(rng: &mut impl Rng) -> String {
    const KNOWN: [&str; 7] = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"];
    match rng.random_range(0..4) {
        0 => KNOWN[rng.random_range(0..KNOWN.len())].to_owned(),
        1 => KNOWN[rng.random_range(0..KNOWN.len())].to_lowercase(),
        _ => (0..rng.random_range(1..12))
            .map(|_| rng.random_range(b'A'..=b'Z') as char)
            .collect(),
    }
}

fn random_word(rng: &mut impl Rng) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";
    (0..rng.random_range(1..16))
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect()
}

/// A repeated cancel is counted once, by a daemon process whose metrics are its own.
#[tokio::test]
async fn a_repeated_cancel_is_counted_once() {
    let redis = RedisServer::start().unwrap();
    let node = standalone("cancels", &redis, "");
    let api = Api::new(node.api);
    api.schedule("c1", "orders", 3_600_000).await;
    for already in [false, true] {
        let (status, answer) = api.delete("/v1/messages/c1").await;
        assert_eq!(
            (status, answer["already"].as_bool()),
            (200, Some(already)),
            "{answer}"
        );
    }
    let metrics = api.metrics().await.expect("metrics");
    assert_eq!(
        value(&metrics, "delayq_messages_cancelled_total"),
        Some(1.0),
        "counted once"
    );
}

#[tokio::test]
async fn http_metrics_keep_a_fixed_set_of_series_whatever_clients_send() {
    let redis = RedisServer::start().unwrap();
    let node = standalone("bounded", &redis, "");
    let api = Api::new(node.api);

    // One request of each shape: every known method and one made up on a path no
    // route matches, and a message id on a route with a parameter.
    for method in [
        "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "BREW",
    ] {
        send(&api, method, "/no/such/path").await;
    }
    send(&api, "GET", "/v1/messages/some-id").await;
    // The first scrape is counted once it has been answered: scrape twice.
    api.metrics().await.unwrap();
    let before = api.metrics().await.unwrap();
    let before = series(&before, "delayq_http_");
    assert!(
        before.iter().any(|s| s.contains("route=\"unmatched\"")),
        "{before:#?}"
    );
    assert!(
        before.iter().any(|s| s.contains("method=\"other\"")),
        "{before:#?}"
    );

    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let requests: Vec<(String, String)> = (0..1000)
        .map(|_| {
            if rng.random_bool(0.2) {
                let id = random_word(&mut rng);
                ("GET".to_owned(), format!("/v1/messages/{id}"))
            } else {
                let path: Vec<String> = (0..rng.random_range(1..5))
                    .map(|_| random_word(&mut rng))
                    .collect();
                let method = random_method(&mut rng);
                (method, format!("/{}", path.join("/")))
            }
        })
        .collect();
    futures::stream::iter(requests)
        .for_each_concurrent(8, |(method, path)| {
            let api = &api;
            async move { send(api, &method, &path).await }
        })
        .await;

    let after = api.metrics().await.unwrap();
    let after = series(&after, "delayq_http_");
    assert_eq!(
        after.len(),
        before.len(),
        "before: {before:#?}\nafter: {after:#?}"
    );
    assert!(
        after
            .iter()
            .any(|s| s.starts_with("delayq_http_requests_total")
                && s.contains("method=\"other\"")
                && s.contains("route=\"unmatched\"")),
        "{after:#?}"
    );
}

#[tokio::test]
async fn metrics_have_help_text_wide_lateness_buckets_and_zeroed_counters() {
    let redis = RedisServer::start().unwrap();
    let node = standalone("helpful", &redis, "");
    let api = Api::new(node.api);
    let (status, _) = api
        .post(
            "/v1/messages",
            json!({ "stream": "s", "payload": "x", "delay_ms": 0 }),
        )
        .await;
    assert_eq!(status, 201);
    let text = eventually(Duration::from_secs(10), "a forward counted", || async {
        let text = api.metrics().await?;
        text.contains("delayq_messages_forwarded_total{stream=\"s\"} 1")
            .then_some(text)
    })
    .await;
    let typed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert!(typed.len() >= 15, "{text}");
    for name in typed {
        let help = format!("# HELP {name} ");
        assert!(
            text.lines()
                .any(|l| l.starts_with(&help) && l.len() > help.len()),
            "{name} has no help text:\n{text}"
        );
    }
    // Lateness has its fine buckets, and more up to an hour.
    for le in ["0.0005", "1", "5", "60", "3600"] {
        assert!(
            text.contains(&format!(
                "delayq_forward_lateness_seconds_bucket{{le=\"{le}\"}}"
            )),
            "le={le}:\n{text}"
        );
    }
    // Without etcd, there is no etcd to reach.
    assert!(!text.contains("delayq_etcd_reachable"), "{text}");
    // Counters an alert may watch are there before anything happened.
    for name in [
        "delayq_fenced_total",
        "delayq_messages_dead_total",
        "delayq_http_auth_failures_total",
        "delayq_config_reloads_total{result=\"refused\"}",
        "delayq_forward_errors_total{shard=\"1\"}",
    ] {
        assert!(text.contains(&format!("\n{name} 0\n")), "{name}:\n{text}");
    }
}

#[tokio::test]
async fn process_metrics_describe_the_daemon_process() {
    let redis = RedisServer::start().unwrap();
    let node = standalone("process", &redis, "");
    let text = Api::new(node.api).metrics().await.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = value(&text, "process_start_time_seconds").expect("start time");
    assert!(
        started <= now + 1.0 && started > now - 120.0,
        "started {started}, now {now}"
    );
    // Its own process: the daemon's pid has the fds and memory shown.
    let fds = value(&text, "process_open_fds").expect("open fds");
    let pid = node.pid().unwrap();
    let listed = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as f64;
    assert!(
        fds >= 5.0 && (fds - listed).abs() < 50.0,
        "{fds} vs {listed}"
    );
    let rss = value(&text, "process_resident_memory_bytes").expect("rss");
    assert!(rss > 1_000_000.0, "{rss}");
    assert!(value(&text, "process_max_fds").expect("fd limit") >= fds);
    assert!(
        value(&text, "process_cpu_seconds_total").is_some(),
        "{text}"
    );
    assert!(value(&text, "process_threads").expect("threads") >= 1.0);
}

#[tokio::test]
async fn the_oldest_overdue_gauge_shows_stuck_delivery_on_the_leader_only() {
    // n0 leads, n1 stands by.
    let cluster = Cluster::start(2, 1, "").await;

    let gauge = |node: usize| {
        let api = &cluster.apis[node];
        async move { value(&api.metrics().await?, "delayq_oldest_overdue_seconds") }
    };
    assert_eq!(gauge(0).await, Some(0.0));
    assert_eq!(gauge(1).await, Some(0.0));

    // A message falls due while Redis refuses writes (full, no eviction): the
    // leader cannot forward it, and says how late it is.
    let mut conn = cluster.redis.client();
    redis_config(&mut conn, "maxmemory-policy", "noeviction");
    let (status, pushed) = cluster.apis[0]
        .post(
            "/v1/messages",
            json!({ "id": "stuck", "stream": "s", "payload": "x", "delay_ms": 1000 }),
        )
        .await;
    assert_eq!(status, 201, "{pushed}");
    redis_config(&mut conn, "maxmemory", "1");
    let late = eventually(Duration::from_secs(20), "overdue on the leader", || async {
        gauge(0).await.filter(|&s| s >= 2.0)
    })
    .await;
    assert!(late < 60.0, "{late}");
    assert_eq!(gauge(1).await, Some(0.0), "the standby forwards nothing");
    assert_eq!(xlen(&mut conn, "s"), 0, "not forwarded yet");

    // Writes again: forwarded, and nothing is overdue any more.
    redis_config(&mut conn, "maxmemory", "0");
    eventually(Duration::from_secs(20), "nothing overdue", || async {
        (gauge(0).await? == 0.0).then_some(())
    })
    .await;
    assert_eq!(xlen(&mut conn, "s"), 1);
    // Redis refused everybody alike: nobody was singled out as cut off.
    let text = cluster.apis[0].metrics().await.expect("metrics");
    assert_eq!(
        value(&text, "delayq_is_leader"),
        Some(1.0),
        "{}",
        cluster.logs()
    );
}

#[tokio::test]
async fn the_etcd_gauge_follows_whether_etcd_answers() {
    let cluster = Cluster::start(1, 1, "").await;
    let api = &cluster.apis[0];
    let reads = |expected: f64| async move {
        let text = api.metrics().await?;
        (value(&text, "delayq_etcd_reachable")? == expected).then_some(())
    };
    eventually(Duration::from_secs(10), "etcd reachable", || reads(1.0)).await;
    cluster.etcd[0].pause();
    eventually(Duration::from_secs(20), "etcd unreachable", || reads(0.0)).await;
    cluster.etcd[0].resume();
    eventually(Duration::from_secs(20), "etcd reachable again", || {
        reads(1.0)
    })
    .await;
}

#[tokio::test]
async fn pending_messages_per_stream_show_the_largest_streams_and_the_rest() {
    let redis = RedisServer::start().unwrap();
    // 105 streams of one message, "big" with 5 and "mid" with 3, an hour ahead.
    let mut messages: Vec<serde_json::Value> = (0..105)
        .map(|i| json!({ "stream": format!("s{i:03}"), "payload": "x", "delay": "1h" }))
        .collect();
    for (stream, n) in [("big", 5), ("mid", 3)] {
        for _ in 0..n {
            messages.push(json!({ "stream": stream, "payload": "x", "delay": "1h" }));
        }
    }
    let mut first = standalone("first", &redis, "");
    for chunk in messages.chunks(50) {
        let (_, answer) = Api::new(first.api)
            .post("/v1/messages/batch", json!({ "messages": chunk }))
            .await;
        assert_eq!(answer["scheduled"], chunk.len(), "{answer}");
    }
    first.kill();

    // A new leader counts at the start of its term.
    let second = standalone("second", &redis, "");
    let node = Api::new(second.api);
    // The rest is there at 0 from the start. A count sets its series one by one,
    // the rest last: once the rest is counted, so is every stream shown.
    let text = eventually(Duration::from_secs(10), "streams counted", || async {
        let text = node.metrics().await?;
        let rest = "delayq_pending_stream_messages{stream=\"(the rest)\"}";
        (value(&text, rest)? > 0.0).then_some(text)
    })
    .await;
    let shown = series(&text, "delayq_pending_stream_messages{");
    assert_eq!(shown.len(), 101, "{shown:#?}");
    let gauge = |stream: &str| {
        value(
            &text,
            &format!("delayq_pending_stream_messages{{stream=\"{stream}\"}}"),
        )
    };
    assert_eq!(gauge("big"), Some(5.0));
    assert_eq!(gauge("mid"), Some(3.0));
    // Ties by name: s000 to s097 are shown, s098 to s104 are the rest.
    assert_eq!(gauge("s097"), Some(1.0));
    assert_eq!(gauge("s098"), None);
    assert_eq!(gauge("(the rest)"), Some(7.0));
}

/// Settings whose series are known from the start: a stream with a rate limit of
/// its own, and watched streams and groups.
const KNOWN_LABELS: &str = "[streams.max_rate]\norders = 50\n[delivery]\ngroups = [\"workers\"]\n[delivery.streams.orders]\n[delivery.streams.billing]\ngroups = [\"invoicing\", \"audit\"]\n";

/// Checks the first `/metrics` of a node started with `config`, taken before any
/// message was pushed: every metric of the table of docs/metrics.md (read from the file) is
/// exported but those with no series `config` makes known at the start; every
/// series known at the start is there (histograms with their `_count`); every
/// counter reads 0 but the node's own role changes (it may lead already) and its CPU
/// time. Returns the documented metrics not exported yet, each with why.
fn check_first_scrape(text: &str, config: &Config) -> Vec<(String, String)> {
    let known = known_series(config);
    let exported: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let documented = documented_metrics();
    assert!(documented.len() >= 60, "{documented:?}");
    let mut waiting = Vec::new();
    for (name, ..) in &documented {
        if exported.contains(&name.as_str()) {
            continue;
        }
        assert!(
            !known.iter().any(|s| s.metric.name == name),
            "{name} is known from the start but not exported:\n{text}"
        );
        let metric = METRICS
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} is documented but not in METRICS"));
        let why = match metric.start {
            Start::Later(why) => why.to_owned(),
            start => format!("{start:?}: not with this configuration"),
        };
        waiting.push((name.clone(), why));
    }
    for series in &known {
        let selector = series.selector();
        let line = match series.metric.kind {
            Kind::Histogram => match selector.split_once('{') {
                Some((name, labels)) => format!("{name}_count{{{labels}"),
                None => format!("{selector}_count"),
            },
            _ => selector.clone(),
        };
        let value = value(text, &line)
            .unwrap_or_else(|| panic!("{line} is not exported from the start:\n{text}"));
        if series.metric.kind != Kind::Counter {
            continue;
        }
        match series.metric.name {
            "process_cpu_seconds_total" => {}
            "delayq_leadership_transitions_total" => assert!(value <= 1.0, "{line} {value}"),
            _ => assert_eq!(value, 0.0, "{line}:\n{text}"),
        }
    }
    waiting
}

#[tokio::test]
async fn every_documented_metric_is_exported_before_the_first_message() {
    let redis = RedisServer::start().unwrap();
    let node = standalone("fresh", &redis, KNOWN_LABELS);
    let text = Api::new(node.api).metrics().await.unwrap();
    let config = Config::from_toml(
        &format!(
            "[redis]\nurl = \"{}\"\nshards = 2\n{KNOWN_LABELS}",
            redis.url()
        ),
        Vec::new(),
    )
    .unwrap();
    let waiting = check_first_scrape(&text, &config);
    // Among them, the metrics of etcd and of per-shard elections: this node has none.
    for name in ["delayq_etcd_reachable", "delayq_group_leader"] {
        assert!(waiting.iter().any(|(w, _)| w == name), "{waiting:#?}");
    }
    assert!(
        text.contains("\ndelayq_forward_errors_total{shard=\"1\"} 0\n"),
        "{text}"
    );
    assert!(
        text.contains("\ndelayq_held_messages{stream=\"orders\"} 0\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "\ndelayq_sweep_entries_total{stream=\"billing\",group=\"audit\",outcome=\"dead\"} 0\n"
        ),
        "{text}"
    );
}

/// On etcd, with per-shard elections and every setting that names series: only the
/// metrics whose labels come with events are missing from a new node's first scrape.
#[tokio::test]
async fn on_etcd_only_metrics_labelled_by_events_wait_for_them() {
    let extra = format!("[election]\nmode = \"per_shard\"\ngroups = 2\n{KNOWN_LABELS}");
    let mut cluster = Cluster::start(1, 1, &extra).await;
    let fresh = cluster.join();
    let text = cluster.apis[fresh].metrics().await.unwrap();
    let endpoints: Vec<String> = cluster.etcd.iter().map(|m| m.endpoint()).collect();
    let config = Config::from_toml(
        &etcd_config(&cluster.redis.url(), &endpoints, &extra),
        Vec::new(),
    )
    .unwrap();
    assert!(config.election.per_shard && config.etcd.is_some());
    let waiting = check_first_scrape(&text, &config);
    let not_later: Vec<_> = waiting
        .iter()
        .filter(|(name, _)| {
            !METRICS
                .iter()
                .any(|m| m.name == name && matches!(m.start, Start::Later(_)))
        })
        .collect();
    assert!(not_later.is_empty(), "{not_later:#?}\n{text}");
    for series in [
        "delayq_group_leader{group=\"1\"}",
        "delayq_etcd_reachable",
        "delayq_lease_remaining_seconds",
        "delayq_keepalive_seconds_count",
    ] {
        assert!(value(&text, series).is_some(), "{series}:\n{text}");
    }
}

/// `delayq_held_messages` follows a stream's held messages down to 0 once a reload
/// lifts its limit and they are delivered: a stream that neither has a limit nor
/// holds anything any more is set back to 0, not left at its last count.
#[tokio::test]
async fn the_held_gauge_goes_back_to_zero_once_a_lifted_limit_has_drained() {
    let redis = RedisServer::start().unwrap();
    let node = standalone("held", &redis, "[streams.max_rate]\nslow = 1\n");
    let api = Api::new(node.api);
    let gauge = "delayq_held_messages{stream=\"slow\"}";
    let items: Vec<_> = (0..20)
        .map(|i| json!({ "id": format!("h{i}"), "stream": "slow", "payload": "x", "delay_ms": 10 }))
        .collect();
    let (status, answer) = api
        .post("/v1/messages/batch", json!({ "messages": items }))
        .await;
    assert_eq!(status, 200, "{answer}");
    eventually(Duration::from_secs(30), "held messages counted", || async {
        value(&api.metrics().await?, gauge).filter(|n| *n >= 5.0)
    })
    .await;

    let file = std::fs::read_to_string(node.config_path()).unwrap();
    std::fs::write(node.config_path(), file.replace("slow = 1\n", "")).unwrap();
    let (status, answer) = api.post("/v1/admin/reload", json!({})).await;
    assert_eq!(status, 200, "{answer}");
    eventually(Duration::from_secs(20), "all delivered", || async {
        (xlen(&mut redis.client(), "slow") == 20).then_some(())
    })
    .await;
    eventually(Duration::from_secs(20), "the gauge back at 0", || async {
        (value(&api.metrics().await?, gauge)? == 0.0).then_some(())
    })
    .await;
}

/// With `allow = ["*"]` any stream is a target: past `metrics.max_streams` streams,
/// the forwarded counter counts the others under `stream="_other"`, and every
/// forward is counted once.
#[tokio::test]
async fn per_stream_series_stop_at_max_streams_and_count_the_rest_as_other() {
    let redis = RedisServer::start().unwrap();
    let node = standalone("bounded", &redis, "[metrics]\nmax_streams = 2\n");
    let api = Api::new(node.api);
    let messages: Vec<_> = (0..12)
        .map(|i| json!({ "stream": format!("t{}", i % 6), "payload": "x", "delay_ms": 0 }))
        .collect();
    let (status, body) = api
        .post("/v1/messages/batch", json!({ "messages": messages }))
        .await;
    assert_eq!(status, 200, "{body}");
    let name = "delayq_messages_forwarded_total";
    let counted = eventually(Duration::from_secs(10), "12 forwards counted", || async {
        let text = api.metrics().await?;
        let counted: Vec<(String, f64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix(name)?.strip_prefix("{stream=\""))
            .filter_map(|l| {
                let (stream, value) = l.split_once("\"} ")?;
                Some((stream.to_owned(), value.parse().ok()?))
            })
            .collect();
        (counted.iter().map(|(_, n)| n).sum::<f64>() == 12.0).then_some(counted)
    })
    .await;
    let named: Vec<&String> = counted
        .iter()
        .map(|(s, _)| s)
        .filter(|s| *s != "_other")
        .collect();
    assert_eq!(named.len(), 2, "{counted:?}");
    let other = counted.iter().find(|(s, _)| s == "_other").map(|(_, n)| *n);
    assert_eq!(other, Some(8.0), "{counted:?}");
    // The forwarding samples (the Streams page's lines, the day's rollups) name the
    // streams alike: bounded by the same number.
    let sampled = eventually(
        Duration::from_secs(20),
        "a sample of the forwards",
        || async {
            let (_, table) = api.get("/v1/streams").await;
            let lines: Vec<(String, u64)> = table["streams"]
                .as_array()?
                .iter()
                .map(|s| {
                    let n = s["delivered_last_hour"]
                        .as_array()
                        .map_or(0, |a| a.iter().filter_map(serde_json::Value::as_u64).sum());
                    (s["stream"].as_str().unwrap_or("").to_owned(), n)
                })
                .filter(|(_, n)| *n > 0)
                .collect();
            (lines.iter().map(|(_, n)| n).sum::<u64>() == 12).then_some(lines)
        },
    )
    .await;
    assert_eq!(sampled.len(), 3, "{sampled:?}");
    assert!(
        sampled.iter().any(|(s, n)| s == "_other" && *n == 8),
        "{sampled:?}"
    );
}
