//! `redis.tls_server_name`: a Redis reached by address whose certificate carries
//! only a name. Without the setting, or with another name, connecting is refused
//! naming it; with it, a daemon delivers over mutual TLS and keeps delivering after
//! Redis restarts (its own connections dial again).

use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisOptions, RedisServer, RedisTlsFiles};
use serde_json::json;

use super::{NAMED_HOST, Pki, check_config, delivered, refused_naming};
use crate::support::{Api, delayq_bin, entries, eventually};

/// A Redis with the "named" certificate that wants client certificates, and the
/// config reaching it by address with `extra` in `[redis]`.
fn named_redis(pki: &Pki) -> RedisServer {
    RedisServer::start_with(RedisOptions {
        aof: true,
        tls: Some(RedisTlsFiles {
            cert: pki.path("named.pem"),
            key: pki.path("named-key.pem"),
            ca: pki.path("ca.pem"),
            client_auth: true,
        }),
        ..RedisOptions::default()
    })
    .expect("a TLS redis-server")
}

fn config(pki: &Pki, redis: &RedisServer, extra: &str) -> String {
    format!(
        "[redis]\nurl = \"{}\"\nshards = 2\n{}{extra}\n",
        redis.tls_url().expect("a TLS port"),
        pki.settings("ca.pem", true)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_name_reaches_a_redis_whose_certificate_names_another_host() {
    let pki = Pki::new().expect("a CA and its certificates");
    let mut redis = named_redis(&pki);

    // By address alone, and with a name the certificate does not carry.
    for extra in ["", "tls_server_name = \"other.delayq.test\""] {
        let config = config(&pki, &redis, extra);
        assert!(check_config(&config).0, "{config}");
        let log = refused_naming(&config, "redis.tls_server_name").await;
        assert!(log.contains("not valid for name"), "{log}");
    }

    let config = config(&pki, &redis, &format!("tls_server_name = \"{NAMED_HOST}\""));
    let (ok, shown) = check_config(&config);
    assert!(ok, "{shown}");
    let node = DelayqProcess::start(&delayq_bin(), "named", &config).expect("start delayq");
    delivered(&node, &redis, "orders").await;

    // Every connection breaks; the next commands dial again.
    redis.restart().expect("restart redis");
    let api = Api::new(node.api);
    eventually(Duration::from_secs(20), "a push accepted again", || async {
        let (status, _) = api
            .post(
                "/v1/messages",
                json!({"stream": "after", "payload": "again", "delay": "10ms"}),
            )
            .await;
        (status == 201).then_some(())
    })
    .await;
    eventually(
        Duration::from_secs(20),
        "delivered after the restart",
        || async { (!entries(&mut redis.client(), "after").is_empty()).then_some(()) },
    )
    .await;
}

#[test]
fn a_server_name_is_checked_before_anything_connects() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = named_redis(&pki);
    let sentinel = "sentinel = { master = \"m\", nodes = [\"127.0.0.1:26379\"] }";
    #[rustfmt::skip]
    let cases: Vec<(String, &str)> = vec![
        ("tls_server_name = \"not a name\"".into(), "must be a DNS name or an IP address"),
        ("tls_server_name = \"\"".into(), "must be a DNS name or an IP address"),
        (format!("tls_server_name = \"{NAMED_HOST}\"\n{sentinel}"), "redis.sentinel"),
    ];
    for (extra, reason) in cases {
        let (ok, shown) = check_config(&config(&pki, &redis, &extra));
        assert!(
            !ok && shown.contains("redis.tls_server_name") && shown.contains(reason),
            "{extra}: {shown}"
        );
    }
    // An address is a name too.
    let (ok, shown) = check_config(&config(&pki, &redis, "tls_server_name = \"127.0.0.1\""));
    assert!(ok, "{shown}");
    // Only for TLS.
    let plain = format!(
        "[redis]\nurl = \"{}\"\ntls_server_name = \"{NAMED_HOST}\"\n",
        redis.url()
    );
    let (ok, shown) = check_config(&plain);
    assert!(
        !ok && shown.contains("redis.tls_server_name") && shown.contains("rediss://"),
        "{shown}"
    );
}
