//! HTTP hygiene against a real daemon and Redis: a bound on the requests served at
//! once (the next is shed with `429` and `Retry-After`), request timeouts that
//! leave long polls alone, an access log that shows routes, never ids, query
//! values or tokens, tokens in read, write and admin scopes, and the address a node
//! is known by.

use std::time::{Duration, Instant};

use serde_json::Value;

use delayq_harness::{DelayqProcess, RedisServer};

use crate::support::{Api, Env, assert_refused, delayq_bin, eventually};

/// The status, the header `header` and the JSON answer of one request.
async fn with_header(
    env: &Env,
    (method, path, body): (&str, &str, Option<&str>),
    token: Option<&str>,
    header: &str,
) -> (u16, Option<String>, Value) {
    let resp = env
        .api
        .send(method, path, token, body.map(str::as_bytes))
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let value = resp
        .headers()
        .get(header)
        .map(|v| v.to_str().expect("ascii").to_owned());
    (status, value, resp.json().await.unwrap_or(Value::Null))
}

/// Status, `Retry-After` and JSON answer of a GET.
async fn get(env: &Env, path: &str) -> (u16, Option<String>, Value) {
    with_header(env, ("GET", path, None), None, "retry-after").await
}

const POLL: &str = "/v1/streams/orders/next?group=g&consumer=c&wait=20s";

#[tokio::test]
async fn past_max_concurrent_requests_the_next_request_is_shed_with_429_and_retry_after() {
    let env = Env::start("[api]\nmax_concurrent_requests = 1\nmax_wait = \"20s\"").await;
    // The open endpoints are checked under overload below (/leader among them).
    env.leading().await;
    // A long poll that takes the only place (tried again while a probe below holds it).
    let poll = {
        let api = env.api.clone();
        tokio::spawn(async move {
            eventually(
                Duration::from_secs(10),
                "the long poll is admitted",
                || async {
                    let (status, body) = api.get(POLL).await;
                    (status != 429).then_some((status, body))
                },
            )
            .await
        })
    };
    let (retry_after, refused) = eventually(
        Duration::from_secs(10),
        "a request is shed while the long poll waits",
        || async {
            let (status, retry_after, body) = get(&env, "/v1/stats").await;
            (status == 429).then_some((retry_after, body))
        },
    )
    .await;
    assert_eq!(retry_after.as_deref(), Some("1"), "{refused}");
    assert_refused(
        (429, &refused),
        (429, "overloaded", "(api.max_concurrent_requests)"),
        "stats while a long poll waits",
    );
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .starts_with("1 requests"),
        "{refused}"
    );

    // More long polls and a push are shed too, each at once; the open endpoints answer.
    for path in [POLL, POLL, "/v1/messages/some-id"] {
        let started = Instant::now();
        let (status, retry_after, body) = get(&env, path).await;
        assert_refused((status, &body), (429, "overloaded", "retry after 1s"), path);
        assert_eq!(retry_after.as_deref(), Some("1"), "{path}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{path}: shed late"
        );
    }
    let (status, _) = env
        .api
        .post(
            "/v1/messages",
            serde_json::json!({"stream": "orders", "payload": "x", "delay": "1s"}),
        )
        .await;
    assert_eq!(status, 429, "a push while the long poll waits");
    for path in ["/healthz", "/readyz", "/leader", "/metrics"] {
        assert_eq!(
            env.api.status(path).await,
            Some(200),
            "{path} under overload"
        );
    }
    assert!(!poll.is_finished(), "the long poll still waits");

    // An entry ends the long poll; its place is free again.
    let _: String = redis::cmd("XADD")
        .arg("orders")
        .arg("*")
        .arg("a")
        .arg("1")
        .query(&mut env.redis.client())
        .expect("XADD");
    let (status, body) = poll.await.expect("long poll task");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"].as_array().map(Vec::len), Some(1), "{body}");
    eventually(
        Duration::from_secs(5),
        "requests are served again",
        || async { (get(&env, "/v1/stats").await.0 == 200).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn a_slow_request_gets_the_timeout_answer_but_a_long_poll_waits_its_time() {
    // One place only: a request answered at its timeout must give it back.
    let env = Env::start(
        "[api]\nrequest_timeout = \"500ms\"\nmax_wait = \"1s\"\nmax_concurrent_requests = 1\n\
         [redis]\ntimeout = \"10s\"",
    )
    .await;

    // A long poll is not cut at request_timeout: it waits as long as it asked.
    let started = Instant::now();
    let (status, _, body) = get(&env, "/v1/streams/orders/next?group=g&consumer=c&wait=1s").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"], serde_json::json!([]), "{body}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "answered after {:?}",
        started.elapsed()
    );

    // Redis holds every command for a while: a push is answered at request_timeout.
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3000)
        .arg("ALL")
        .query(&mut env.redis.client())
        .expect("CLIENT PAUSE");
    let started = Instant::now();
    let (status, answer) = env
        .api
        .post(
            "/v1/messages",
            serde_json::json!({"stream": "orders", "payload": "x", "delay": "1s"}),
        )
        .await;
    let took = started.elapsed();
    assert_refused(
        (status, &answer),
        (
            503,
            "timeout",
            "no answer within 500ms (api.request_timeout)",
        ),
        "a push while Redis is paused",
    );
    assert!(took < Duration::from_secs(2), "answered after {took:?}");

    // Once Redis answers again, so does the API.
    eventually(Duration::from_secs(10), "pushes succeed again", || async {
        let (status, _) = env
            .api
            .post(
                "/v1/messages",
                serde_json::json!({"stream": "orders", "payload": "x", "delay": "1s"}),
            )
            .await;
        (status == 201).then_some(())
    })
    .await;
}

#[tokio::test]
async fn every_request_is_one_debug_access_line_without_ids_query_values_or_tokens() {
    const TOKEN: &str = "tok-Ac7-secret";
    const ID: &str = "id-Hk3-secret";
    const QUERY: &str = "query-Vb8-secret";
    let redis = RedisServer::start().unwrap();
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 2\n[api]\ntokens = [\"{TOKEN}\"]\n\
         [log]\nlevel = \"info,delayq::api::access=debug\"\n",
        redis.url()
    );
    let node = DelayqProcess::start(&delayq_bin(), "access", &config).unwrap();
    let api = Api::new(node.api);
    let status = |path: String, token: Option<&'static str>| {
        let api = &api;
        async move { api.call("GET", &path, token, None).await.0 }
    };
    let push = format!(r#"{{"stream": "s", "delay": "1h", "id": "{ID}", "payload": "x"}}"#);
    let (pushed, _) = api
        .call("POST", "/v1/messages", Some(TOKEN), Some(&push))
        .await;
    assert_eq!(pushed, 201);
    assert_eq!(status(format!("/v1/messages/{ID}"), Some(TOKEN)).await, 200);
    let upcoming = format!("/v1/upcoming?stream={QUERY}");
    assert_eq!(status(upcoming, Some(TOKEN)).await, 200);
    assert_eq!(
        status(format!("/v1/messages/{ID}?sig={QUERY}"), None).await,
        401
    );
    assert_eq!(status(format!("/elsewhere?sig={QUERY}"), None).await, 404);
    // A parameter the endpoint does not take: refused, and still not logged.
    assert_eq!(status(format!("/healthz?sig={QUERY}"), None).await, 400);

    // One line each, in order: method, route pattern and status.
    let expected = [
        ("POST", "/v1/messages", 201),
        ("GET", "/v1/messages/{id}", 200),
        ("GET", "/v1/upcoming", 200),
        ("GET", "/v1/messages/{id}", 401),
        ("GET", "unmatched", 404),
        ("GET", "/healthz", 400),
    ];
    let lines = eventually(Duration::from_secs(10), "six access lines", || async {
        let lines: Vec<String> = node
            .full_log()
            .lines()
            .filter(|l| l.contains("delayq::api::access"))
            .map(str::to_owned)
            .collect();
        (lines.len() >= expected.len()).then_some(lines)
    })
    .await;
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    for (line, (method, route, status)) in lines.iter().zip(expected) {
        for part in [
            "DEBUG".to_owned(),
            format!("method={method} route={route}}}"),
            format!("status={status} ms="),
        ] {
            assert!(line.contains(&part), "{line:?} should contain {part:?}");
        }
    }
    assert!(lines[1].contains("bytes="), "{}", lines[1]);
    let log = node.full_log();
    for secret in [TOKEN, ID, QUERY] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}

/// Tokens of each scope, for the scope tests.
const ADMIN: &str = "admin-tok";
const WRITER: &str = "write-tok";
const READER: &str = "read-tok";

/// A request of each scope: method, path, body, and its status when allowed.
const READ_REQUEST: (&str, &str, Option<&str>, u16) = ("GET", "/v1/stats", None, 200);
const WRITE_REQUEST: (&str, &str, Option<&str>, u16) = (
    "POST",
    "/v1/messages",
    Some(r#"{"stream":"orders","payload":"x","delay":"1h"}"#),
    201,
);
const POLL_REQUEST: (&str, &str, Option<&str>, u16) = (
    "GET",
    "/v1/streams/orders/next?group=g&consumer=c&wait=0s",
    None,
    200,
);
const ADMIN_REQUEST: (&str, &str, Option<&str>, u16) = (
    "POST",
    "/v1/streams/orders/dead/purge",
    Some(r#"{"all":true}"#),
    200,
);

/// Status, `WWW-Authenticate` and JSON answer of one request.
async fn call(
    env: &Env,
    (method, path, body, _): (&str, &str, Option<&str>, u16),
    token: Option<&str>,
) -> (u16, Option<String>, Value) {
    with_header(env, (method, path, body), token, "www-authenticate").await
}

#[tokio::test]
async fn each_token_reaches_the_endpoints_of_its_scope_and_below() {
    let env = Env::start(&format!(
        "[api]\ntokens = [\"{ADMIN}\"]\nwrite_tokens = [\"{WRITER}\"]\nread_tokens = [\"{READER}\"]"
    ))
    .await;
    // (token, request, the scope it is refused for lacking; None: allowed)
    #[rustfmt::skip]
    let cases = [
        (READER, READ_REQUEST, None),
        (READER, WRITE_REQUEST, Some("write")),
        (READER, POLL_REQUEST, Some("write")),
        (READER, ADMIN_REQUEST, Some("admin")),
        (WRITER, READ_REQUEST, None),
        (WRITER, WRITE_REQUEST, None),
        (WRITER, POLL_REQUEST, None),
        (WRITER, ADMIN_REQUEST, Some("admin")),
        (ADMIN, READ_REQUEST, None),
        (ADMIN, WRITE_REQUEST, None),
        (ADMIN, POLL_REQUEST, None),
        (ADMIN, ADMIN_REQUEST, None),
    ];
    for (token, request, refused_for) in cases {
        let case = format!("{token} on {} {}", request.0, request.1);
        let (status, challenge, answer) = call(&env, request, Some(token)).await;
        match refused_for {
            None => assert_eq!(status, request.3, "{case}: {answer}"),
            Some(scope) => {
                let held = &token[..token.find('-').unwrap()];
                assert_refused(
                    (status, &answer),
                    (
                        403,
                        "insufficient_scope",
                        &format!("needs the {scope} scope"),
                    ),
                    &case,
                );
                let detail = answer["detail"].as_str().unwrap();
                assert!(
                    detail.contains(&format!("this token has the {held} scope")),
                    "{case}: {detail}"
                );
                assert!(!detail.contains(token), "{case}: {detail}");
                assert_eq!(
                    challenge.as_deref(),
                    Some(
                        format!(
                            "Bearer realm=\"delayq\", error=\"insufficient_scope\", scope=\"{scope}\""
                        )
                        .as_str()
                    ),
                    "{case}"
                );
            }
        }
    }
    // Without a token, or with an unknown one, every scope's endpoint is 401.
    for request in [READ_REQUEST, WRITE_REQUEST, ADMIN_REQUEST] {
        for (token, code) in [(None, "missing_token"), (Some("nope"), "invalid_token")] {
            let (status, challenge, answer) = call(&env, request, token).await;
            let case = format!("{token:?} on {} {}", request.0, request.1);
            assert_refused((status, &answer), (401, code, "api."), &case);
            assert_eq!(
                challenge.as_deref(),
                Some("Bearer realm=\"delayq\""),
                "{case}"
            );
        }
    }
    // The open endpoints stay open.
    env.leading().await;
    for path in ["/healthz", "/readyz", "/leader", "/metrics"] {
        assert_eq!(
            env.api.status(path).await,
            Some(200),
            "{path} without a token"
        );
    }
}

/// A large body sent where nothing reads it (no such route, a method the route does
/// not take, a missing token, a token of too narrow a scope): the client, still
/// sending when the answer is decided, gets that answer, not a reset connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_nothing_reads_still_get_their_answer() {
    let env = Env::start(&format!(
        "[api]\ntokens = [\"{ADMIN}\"]\nread_tokens = [\"{READER}\"]"
    ))
    .await;
    // Past what a single push may send (six times max_message_bytes).
    let body = format!("{{\"a\":\"{}\"}}", "x".repeat(7 << 20));
    #[rustfmt::skip]
    let cases: [(&str, &str, Option<&str>, u16); 5] = [
        ("POST", "/v1/no-such-route", Some(ADMIN), 404),
        ("PUT", "/v1/messages", Some(ADMIN), 405),
        ("POST", "/v1/messages", None, 401),
        ("POST", "/v1/messages", Some(READER), 403),
        ("POST", "/v1/messages", Some(ADMIN), 413),
    ];
    for (method, path, token, want) in cases {
        for round in 0..3 {
            let (status, answer) = env
                .api
                .try_call(method, path, token, Some(&body))
                .await
                .unwrap_or_else(|e| panic!("{method} {path} round {round}: no answer: {e}"));
            assert_eq!(status, want, "{method} {path}: {answer}");
        }
    }
}

/// A node is known by `api.advertise`, in its leader entry and in the registry,
/// and by its bound address without it.
#[tokio::test]
async fn a_node_is_known_by_its_advertised_address() {
    const TOKEN: &str = "tok-Ad4-secret";
    let redis = RedisServer::start().unwrap();
    for advertise in [Some("node-a.example:7070"), None] {
        let mut config = format!(
            "[redis]\nurl = \"{}\"\nshards = 2\n[api]\ntokens = [\"{TOKEN}\"]\n",
            redis.url()
        );
        if let Some(a) = advertise {
            config.push_str(&format!("advertise = \"{a}\"\n"));
        }
        let node = DelayqProcess::start(&delayq_bin(), "advertised", &config).unwrap();
        let api = Api::new(node.api).with_token(TOKEN);
        let want = advertise.map_or_else(|| node.api.to_string(), str::to_owned);
        let (_, view) = eventually(Duration::from_secs(10), "a leader", || async {
            let (status, view) = api.try_get("/v1/leader").await?;
            (status == 200 && view["is_leader"] == true).then_some((status, view))
        })
        .await;
        assert_eq!(view["leader"]["address"], want.as_str(), "{view}");
        eventually(Duration::from_secs(10), "registered", || async {
            let (_, nodes) = api.try_get("/v1/nodes").await?;
            (nodes["nodes"][0]["address"] == want.as_str()).then_some(())
        })
        .await;
        drop(node);
        let () = redis::cmd("FLUSHALL").query(&mut redis.client()).unwrap();
    }
}
