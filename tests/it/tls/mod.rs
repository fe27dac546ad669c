//! Redis over TLS (`rediss://`) with an ACL user: a daemon delivers through it; a CA
//! that did not sign the server's certificate fails the start with a reason naming
//! the setting; with mutual TLS, a client certificate is needed and suffices.
//! etcd over TLS with a user (`etcd`): the same, and a failover with TLS everywhere.

mod api;
mod cluster;
mod etcd;
mod journal;
mod server_name;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};
use serde_json::json;

use crate::support::{Api, delayq_bin, entries, eventually, text, within};

pub(crate) use delayq_harness::{NAMED_HOST, Pki, authority};

/// An ACL user that may do what delayq does, with its password in a file.
fn acl_user(redis: &RedisServer, dir: &Path) -> PathBuf {
    acl_user_on(&[redis], dir)
}

/// [`acl_user`] on each of `nodes` (ACL users are each node's own).
fn acl_user_on(nodes: &[&RedisServer], dir: &Path) -> PathBuf {
    for node in nodes {
        let () = redis::cmd("ACL")
            .arg(&["SETUSER", "dq", "on", ">s3cret-pw", "~*", "&*", "+@all"][..])
            .query(&mut node.client())
            .expect("ACL SETUSER");
    }
    let file = dir.join("redis-password");
    std::fs::write(&file, "s3cret-pw\n").unwrap();
    file
}

fn config(redis: &RedisServer, password: &Path, tls: &str) -> String {
    let url = redis
        .tls_url()
        .expect("a TLS port")
        .replace("rediss://", "rediss://dq@");
    format!(
        "[redis]\nurl = \"{url}\"\npassword_file = \"{}\"\nshards = 2\n{tls}\n",
        password.display()
    )
}

/// Pushes one message through the node's API; waits for it in the stream.
async fn delivered(node: &DelayqProcess, redis: &RedisServer, stream: &str) {
    delivered_among(node, &[], redis, stream).await
}

/// [`delivered`], showing the logs of `others` too if the message never arrives.
async fn delivered_among(
    node: &DelayqProcess,
    others: &[&DelayqProcess],
    redis: &RedisServer,
    stream: &str,
) {
    let api = Api::new(node.api);
    let (status, body) = api
        .post(
            "/v1/messages",
            json!({"stream": stream, "payload": "over TLS", "delay": "10ms"}),
        )
        .await;
    assert_eq!(status, 201, "{body}\n{}", node.log());
    let found = within(Duration::from_secs(10), || async {
        (!entries(&mut redis.client(), stream).is_empty()).then_some(())
    })
    .await;
    assert!(
        found.is_some(),
        "the message to {stream} was not delivered; the node's log:\n{}\nthe others':\n{}",
        node.log(),
        others
            .iter()
            .map(|o| o.log())
            .collect::<Vec<_>>()
            .join("\n----\n")
    );
}

fn check_config(config: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("delayq.toml");
    std::fs::write(&file, config).unwrap();
    let out = Command::new(delayq_bin())
        .args(["check-config", "--config"])
        .arg(&file)
        .output()
        .expect("run check-config");
    (
        out.status.success(),
        format!("{}{}", text(&out.stdout), text(&out.stderr)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_delivers_through_tls_redis_as_an_acl_user_and_never_shows_the_password() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = pki.redis(false).expect("a TLS redis-server");
    let password = acl_user(&redis, pki.dir.path());
    let tls = format!("tls_ca_file = \"{}\"", pki.path("ca.pem").display());
    let config = config(&redis, &password, &tls);
    let (ok, shown) = check_config(&config);
    assert!(ok, "{shown}");
    assert!(!shown.contains("s3cret-pw"), "{shown}");
    let node = DelayqProcess::start(&delayq_bin(), "tls", &config).expect("start delayq");
    delivered(&node, &redis, "orders").await;
    assert!(!node.full_log().contains("s3cret-pw"), "{}", node.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_settings_are_checked_before_anything_connects() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = pki.redis(false).expect("a TLS redis-server");
    let password = acl_user(&redis, pki.dir.path());
    let p = |name: &str| pki.path(name).display().to_string();
    #[rustfmt::skip]
    let cases: Vec<(String, &str)> = vec![
        (format!("tls_ca_file = \"{}\"", p("missing.pem")), "redis.tls_ca_file"),
        (format!("tls_ca_file = \"{}\"", p("server-key.pem")), "redis.tls_ca_file"),
        (format!("tls_cert_file = \"{}\"", p("client.pem")), "redis.tls_key_file"),
        (format!("tls_key_file = \"{}\"", p("client-key.pem")), "redis.tls_cert_file"),
        (format!("tls_cert_file = \"{}\"\ntls_key_file = \"{}\"", p("client.pem"), p("ca.pem")), "redis.tls_key_file"),
    ];
    for (tls, key) in cases {
        let (ok, shown) = check_config(&config(&redis, &password, &tls));
        assert!(!ok && shown.contains(key), "{tls}: {shown}");
    }
    // TLS files with a plain redis:// URL.
    let plain = format!(
        "[redis]\nurl = \"{}\"\ntls_ca_file = \"{}\"\n",
        redis.url(),
        p("ca.pem")
    );
    let (ok, shown) = check_config(&plain);
    assert!(
        !ok && shown.contains("redis.tls_ca_file") && shown.contains("rediss://"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_that_did_not_sign_the_server_certificate_is_refused_naming_the_setting() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = pki.redis(false).expect("a TLS redis-server");
    let password = acl_user(&redis, pki.dir.path());
    let tls = format!("tls_ca_file = \"{}\"", pki.path("other-ca.pem").display());
    let config = config(&redis, &password, &tls);
    // The files are well-formed: only connecting can tell.
    assert!(check_config(&config).0);
    refused_naming(&config, "redis.tls_ca_file").await;
}

/// Starts a daemon that connecting refuses; returns its log (or the error of a
/// start that failed) once it names `key`.
async fn refused_naming(config: &str, key: &str) -> String {
    let log = match DelayqProcess::start(&delayq_bin(), "refused", config) {
        Err(e) => format!("{e:#}"),
        Ok(node) => {
            eventually(Duration::from_secs(10), "the refusal logged", || async {
                let log = node.log();
                log.contains(key).then_some(log)
            })
            .await
        }
    };
    assert!(log.contains(key), "{log}");
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_a_client_certificate_and_works_with_one() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = pki.redis(true).expect("a TLS redis-server");
    let password = acl_user(&redis, pki.dir.path());
    let ca = format!("tls_ca_file = \"{}\"", pki.path("ca.pem").display());
    let client = format!(
        "{ca}\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
        pki.path("client.pem").display(),
        pki.path("client-key.pem").display()
    );
    let node = DelayqProcess::start(&delayq_bin(), "mtls", &config(&redis, &password, &client))
        .expect("start delayq with a client certificate");
    delivered(&node, &redis, "orders").await;
    drop(node);

    // Without one the server refuses the handshake.
    let client = redis::Client::build_with_tls(
        redis.tls_url().unwrap(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(pki.path("ca.pem")).unwrap()),
        },
    )
    .unwrap();
    // With TLS 1.3 the server may refuse the certificate only after the handshake
    // completed on the client's side: then the first command fails.
    let pinged = match client.get_multiplexed_async_connection().await {
        Err(_) => false,
        Ok(mut conn) => redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .is_ok(),
    };
    assert!(!pinged, "a TLS client without a certificate was served");
}

#[test]
fn the_production_example_passes_check_config_with_its_files_in_place() {
    let pki = Pki::new().expect("a CA and its certificates");
    // The certificates where the example names them, the secrets as credentials.
    let tls = pki.dir.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    for (to, from) in [
        ("redis-ca.pem", "ca.pem"),
        ("redis-client.pem", "client.pem"),
        ("etcd-ca.pem", "ca.pem"),
        ("etcd-client.pem", "client.pem"),
    ] {
        std::fs::copy(pki.path(from), tls.join(to)).unwrap();
    }
    let credentials = pki.dir.path().join("credentials");
    std::fs::create_dir(&credentials).unwrap();
    for name in ["redis-password", "sentinel-password", "etcd-password"] {
        std::fs::write(credentials.join(name), format!("{name}-s3cret\n")).unwrap();
    }
    std::fs::write(credentials.join("api-tokens"), "a-long-api-token-s3cret\n").unwrap();
    for name in ["redis-client-key.pem", "etcd-client-key.pem"] {
        std::fs::copy(pki.path("client-key.pem"), credentials.join(name)).unwrap();
    }
    let example =
        std::fs::read_to_string(crate::support::repo().join("config/examples/production.toml"))
            .expect("the example");
    let file = pki.path("production.toml");
    std::fs::write(
        &file,
        example.replace("/etc/delayq/tls/", &format!("{}/", tls.display())),
    )
    .unwrap();
    let out = Command::new(delayq_bin())
        .args(["check-config", "--config"])
        .arg(&file)
        .env("CREDENTIALS_DIRECTORY", &credentials)
        .output()
        .expect("run check-config");
    let shown = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");
    for key in ["sentinel", "min_replicas_acked = 1", "user = \"delayq\""] {
        assert!(shown.contains(key), "{key}: {shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_over_tls_name_a_tls_master() {
    use delayq_harness::{SentinelOptions, SentinelServer};
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = pki.redis(false).expect("a TLS redis-server");
    let password = acl_user(&redis, pki.dir.path());
    // The Sentinel serves TLS only, and watches the master on its TLS port.
    let sentinel = SentinelServer::start_with(
        "tls-main",
        redis.tls_port.expect("a TLS port"),
        1,
        Duration::from_secs(5),
        &SentinelOptions {
            tls: Some(pki.server(false)),
            ..SentinelOptions::default()
        },
    )
    .expect("a TLS sentinel");
    let config = format!(
        "[redis]\nurl = \"rediss://dq@tls-main\"\npassword_file = \"{}\"\nshards = 2\n{}sentinel = {{ master = \"tls-main\", nodes = [\"{}\"] }}\n",
        password.display(),
        pki.settings("ca.pem", false),
        sentinel.address(),
    );
    let (ok, shown) = check_config(&config);
    assert!(ok, "{shown}");
    let node = DelayqProcess::start(&delayq_bin(), "sentinel-tls", &config).expect("start");
    delivered(&node, &redis, "orders").await;
    assert!(
        node.log().contains("Sentinel names the Redis master"),
        "{}",
        node.log()
    );
}
