//! HTTPS for the API (`api.tls`): a client that trusts the certificate's CA gets
//! its answers and one that does not, or that reached it by a name the certificate
//! does not carry, is refused; the CLI speaks https with `--ca-file`; a certificate
//! swapped under SIGHUP serves new connections while a long poll stays open.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};
use rcgen::{CertificateParams, DnType, KeyPair, SanType};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::{Pki, authority};
use crate::support::{delayq_bin, eventually};

/// A daemon on `redis` serving the certificate and key at `cert` and `key`.
fn https_node(redis: &RedisServer, cert: &Path, key: &Path) -> DelayqProcess {
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 2\n[api]\ntls = {{ cert_file = \"{}\", key_file = \"{}\" }}\n",
        redis.url(),
        cert.display(),
        key.display()
    );
    DelayqProcess::start(&delayq_bin(), "https", &config).expect("start delayq")
}

/// A client that trusts only the CAs of `ca`.
fn trusting(ca: &Path) -> reqwest::Client {
    client_with(ca, None)
}

/// A client that trusts only the CAs of `ca`, showing the certificate chain and
/// key of `identity` (PEM files) when asked for one.
fn client_with(ca: &Path, identity: Option<(&Path, &Path)>) -> reqwest::Client {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let tls = match identity {
        None => builder.with_no_client_auth(),
        Some((chain, key)) => {
            let chain = CertificateDer::pem_file_iter(chain)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// `GET url` with `client`: the status and body, or the error's whole chain.
async fn get(client: &reqwest::Client, url: &str) -> Result<(u16, String), String> {
    match client.get(url).send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            Ok((status, resp.text().await.unwrap_or_default()))
        }
        Err(e) => {
            let mut chain = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                chain += &format!(": {s}");
                source = s.source();
            }
            Err(chain)
        }
    }
}

/// `delayq leader` against `url`, with `--ca-file` when given: exit code and output.
fn cli_leader(url: &str, ca: Option<&Path>) -> (i32, String) {
    let mut cmd = std::process::Command::new(delayq_bin());
    cmd.arg("leader")
        .arg("--url")
        .arg(url)
        .env_remove("DELAYQ_CA_FILE");
    if let Some(ca) = ca {
        cmd.arg("--ca-file").arg(ca);
    }
    let out = cmd.output().expect("run delayq");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test]
async fn the_api_answers_https_to_clients_that_trust_its_ca_and_refuses_the_others() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = RedisServer::start().unwrap();
    let node = https_node(&redis, &pki.path("server.pem"), &pki.path("server-key.pem"));
    let base = format!("https://127.0.0.1:{}", node.api.port());
    let healthz = format!("{base}/healthz");

    let answer = eventually(Duration::from_secs(10), "an https answer", || async {
        get(&trusting(&pki.path("ca.pem")), &healthz).await.ok()
    })
    .await;
    assert_eq!(answer.0, 200, "{answer:?}");
    // By name too: the certificate carries localhost.
    let by_name = format!("https://localhost:{}/healthz", node.api.port());
    assert_eq!(
        get(&trusting(&pki.path("ca.pem")), &by_name)
            .await
            .map(|a| a.0),
        Ok(200)
    );

    let refused = get(&trusting(&pki.path("other-ca.pem")), &healthz).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("UnknownIssuer")),
        "a CA that did not sign it: {refused:?}"
    );
    // Plain HTTP to the TLS listener gets no answer.
    crate::support::tls_provider();
    let plain = get(
        &reqwest::Client::new(),
        &format!("http://127.0.0.1:{}/healthz", node.api.port()),
    )
    .await;
    assert!(plain.is_err(), "plain HTTP: {plain:?}");

    // The CLI: with the CA it asks and gets the answer; without, it says why not.
    let (code, out) = cli_leader(&base, Some(&pki.path("ca.pem")));
    assert_eq!(code, 0, "{out}");
    let (code, out) = cli_leader(&base, None);
    assert_eq!(code, 7, "{out}");
    assert!(
        out.contains("cannot reach") && out.contains("certificate"),
        "{out}"
    );
}

#[tokio::test]
async fn a_name_the_certificate_does_not_carry_is_refused() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = RedisServer::start().unwrap();
    // Carries only redis.delayq.test: reached as 127.0.0.1, the name does not match.
    let node = https_node(&redis, &pki.path("named.pem"), &pki.path("named-key.pem"));
    let url = format!("https://127.0.0.1:{}/healthz", node.api.port());
    let refused = get(&trusting(&pki.path("ca.pem")), &url).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("not valid for name")),
        "{refused:?}\n{}",
        node.log()
    );
}

/// A certificate for localhost and 127.0.0.1 signed by a CA of its own: the CA's
/// PEM file, and the certificate's and key's.
fn another_ca_and_server(dir: &Path) -> (PathBuf, String, String) {
    let (ca, ca_key) = authority("the next delayq test CA").expect("a CA");
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "delayq next server");
    params
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    let ca_file = dir.join("next-ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    (ca_file, cert.pem(), key.serialize_pem())
}

#[tokio::test]
async fn a_certificate_swapped_under_sighup_serves_new_connections_while_a_long_poll_stays() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("api.pem"), dir.path().join("api-key.pem"));
    std::fs::copy(pki.path("server.pem"), &cert).unwrap();
    std::fs::copy(pki.path("server-key.pem"), &key).unwrap();
    let node = https_node(&redis, &cert, &key);
    let base = format!("https://127.0.0.1:{}", node.api.port());
    let old = trusting(&pki.path("ca.pem"));
    eventually(Duration::from_secs(10), "an https answer", || async {
        get(&old, &format!("{base}/healthz")).await.ok()
    })
    .await;

    // A long poll on a connection made with the old certificate.
    let poll = {
        let (old, url) = (
            old.clone(),
            format!("{base}/v1/streams/s/next?group=g&consumer=c&wait=3s"),
        );
        tokio::spawn(async move { get(&old, &url).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (next_ca, next_cert, next_key) = another_ca_and_server(dir.path());
    std::fs::write(&cert, next_cert).unwrap();
    std::fs::write(&key, next_key).unwrap();
    node.signal(libc::SIGHUP);

    let next = trusting(&next_ca);
    eventually(
        Duration::from_secs(10),
        "the new certificate served",
        || async { get(&next, &format!("{base}/healthz")).await.ok() },
    )
    .await;
    let polled = poll.await.unwrap();
    assert_eq!(
        polled.as_ref().map(|a| a.0),
        Ok(200),
        "the long poll: {polled:?}"
    );
    // A new connection trusting only the old CA is refused now.
    let refused = get(&trusting(&pki.path("ca.pem")), &format!("{base}/healthz")).await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(node.log().contains("read again"), "{}", node.log());
}

#[tokio::test]
async fn with_client_ca_file_a_client_certificate_is_needed_and_suffices() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = RedisServer::start().unwrap();
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 2\n[api]\ntls = {{ cert_file = \"{}\", key_file = \"{}\", client_ca_file = \"{}\" }}\n",
        redis.url(),
        pki.path("server.pem").display(),
        pki.path("server-key.pem").display(),
        pki.path("ca.pem").display()
    );
    let node = DelayqProcess::start(&delayq_bin(), "mtls", &config).expect("start delayq");
    let url = format!("https://127.0.0.1:{}/healthz", node.api.port());
    let with_cert = client_with(
        &pki.path("ca.pem"),
        Some((&pki.path("client.pem"), &pki.path("client-key.pem"))),
    );
    let answer = eventually(
        Duration::from_secs(10),
        "an answer with a certificate",
        || async { get(&with_cert, &url).await.ok() },
    )
    .await;
    assert_eq!(answer.0, 200, "{answer:?}");
    let refused = get(&trusting(&pki.path("ca.pem")), &url).await;
    assert!(
        refused.is_err(),
        "without a client certificate: {refused:?}"
    );
}

/// The dashboard over https: every call the page makes goes to its own origin, so
/// it works unchanged (the test's browser takes the test's certificate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_over_https() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = RedisServer::start().unwrap();
    let node = https_node(&redis, &pki.path("server.pem"), &pki.path("server-key.pem"));
    let base = format!("https://localhost:{}", node.api.port());
    let browser = crate::support::browser::Browser::open_with(
        &base,
        "https",
        &["--ignore-certificate-errors"],
    )
    .await;
    browser.goto("/ui#/overview").await;
    browser
        .wait_text("#node-role", "this node's role", |t| t.contains("leader"))
        .await;
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors over https: {errors:?}");
    browser.screenshot("https-overview").await;
}
