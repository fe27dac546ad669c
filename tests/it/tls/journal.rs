//! TLS to the journal's MariaDB (`journal.tls`): a server that requires TLS takes
//! the journal over it, checked against the CA given; a daemon without the setting,
//! with a CA that did not sign the server's certificate, or against a server that
//! offers no TLS, refuses to start, naming the setting.

use std::time::Duration;

use delayq_harness::{DelayqProcess, MariaDbServer, MariaDbTls, RedisServer};
use serde_json::json;

use super::Pki;
use crate::support::{Api, delayq_bin, eventually};

fn config(redis: &RedisServer, db: &MariaDbServer, tls: &str) -> String {
    format!(
        "[redis]\nurl = \"{}\"\nshards = 2\n[journal]\nurl = \"{}\"\n{tls}",
        redis.url(),
        db.url_with_password()
    )
}

/// The start of a daemon that must fail: its log.
fn refused(config: &str) -> String {
    match DelayqProcess::start(&delayq_bin(), "refused", config) {
        Ok(node) => panic!("started: {}", node.log()),
        Err(e) => format!("{e:#}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_goes_over_tls_checked_against_its_ca_and_nothing_less_is_taken() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = RedisServer::start().unwrap();
    let db = MariaDbServer::start_with(Some(MariaDbTls {
        cert: pki.path("server.pem"),
        key: pki.path("server-key.pem"),
        required: true,
    }))
    .unwrap();
    let ca = format!(
        "tls = {{ ca_file = \"{}\" }}\n",
        pki.path("ca.pem").display()
    );
    let node = DelayqProcess::start(&delayq_bin(), "tls-journal", &config(&redis, &db, &ca))
        .expect("start delayq");
    let (status, body) = Api::new(node.api)
        .post(
            "/v1/messages",
            json!({"id": "j1", "stream": "s", "payload": "x", "delay": "1h"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    eventually(Duration::from_secs(10), "the row journaled", || {
        let rows = db
            .sql("SELECT id FROM delayq.delayq_messages")
            .unwrap_or_default();
        std::future::ready(rows.contains("j1").then_some(()))
    })
    .await;
    let accepted = db.sql("SHOW GLOBAL STATUS LIKE 'Ssl_accepts'").unwrap();
    assert!(
        accepted
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse::<u64>().ok())
            > Some(0),
        "{accepted}"
    );

    let without = refused(&config(&redis, &db, ""));
    // MariaDB refuses a connection without TLS that it requires as access denied.
    assert!(without.contains("journal.tls"), "{without}");
    let other = format!(
        "tls = {{ ca_file = \"{}\" }}\n",
        pki.path("other-ca.pem").display()
    );
    let wrong_ca = refused(&config(&redis, &db, &other));
    assert!(wrong_ca.contains("(journal.tls)"), "{wrong_ca}");

    let plain = MariaDbServer::start().unwrap();
    let no_tls = refused(&config(&redis, &plain, &ca));
    assert!(
        no_tls.contains("offers no TLS, which journal.tls requires"),
        "{no_tls}"
    );
}
