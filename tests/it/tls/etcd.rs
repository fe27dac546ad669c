//! etcd over TLS (client certificates required) with auth on and an etcd user
//! that may use only delayq's prefix: two daemons, Redis over mutual TLS too, elect
//! a leader, deliver and fail over after a SIGKILL; a wrong CA, server name or
//! password, or a user without permission, is refused naming its setting (the
//! instance stays up as a standby and keeps trying); the settings are checked up front.

use etcd_client::{Client, Permission};
use libc::SIGKILL;

use delayq_harness::EtcdServer;

use super::*;

const ETCD_PASSWORD: &str = "etcd-s3cret-pw";

/// A TLS etcd that needs client certificates, with auth enabled and a user `dq`
/// whose role may read and write `/delayq/` only.
async fn etcd(pki: &Pki) -> EtcdServer {
    let etcd = EtcdServer::start_tls(pki.server(true)).expect("a TLS etcd");
    let mut c = Client::connect([etcd.endpoint()], None)
        .await
        .expect("connect to etcd's plain port");
    c.role_add("dq").await.expect("role add");
    c.role_grant_permission("dq", Permission::read_write("/delayq/").with_prefix())
        .await
        .expect("grant the prefix");
    c.user_add("dq", ETCD_PASSWORD, None)
        .await
        .expect("user add");
    c.user_grant_role("dq", "dq").await.expect("grant role");
    // A user with a role that grants nothing.
    c.role_add("none").await.expect("role add");
    c.user_add("nobody", ETCD_PASSWORD, None)
        .await
        .expect("user add");
    c.user_grant_role("nobody", "none")
        .await
        .expect("grant role");
    c.user_add("root", "root-pw", None).await.expect("root");
    c.user_grant_role("root", "root").await.expect("root role");
    c.auth_enable().await.expect("auth enable");
    etcd
}

/// The `[etcd]` section: TLS endpoint, user `dq`, mutual TLS with `ca` trusted.
fn section(etcd: &EtcdServer, pki: &Pki, ca: &str, password: &str, extra: &str) -> String {
    let file = pki.path("etcd-password");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    format!(
        "[etcd]\nendpoints = [\"{}\"]\nlease_ttl = \"2s\"\nuser = \"dq\"\npassword_file = \"{}\"\n{}{extra}\n",
        etcd.tls_endpoint().expect("a TLS port"),
        file.display(),
        pki.settings(ca, true),
    )
}

async fn leads(node: &DelayqProcess) -> bool {
    Api::new(node.api).get("/leader").await.0 == 200
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_everywhere_a_standby_takes_over_from_a_killed_leader() {
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = pki.redis(true).expect("a TLS redis-server");
    let etcd = etcd(&pki).await;
    let password = acl_user(&redis, pki.dir.path());
    let config = format!(
        "{}{}",
        config(&redis, &password, &pki.settings("ca.pem", true)),
        section(&etcd, &pki, "ca.pem", ETCD_PASSWORD, "")
    );
    let (ok, shown) = check_config(&config);
    assert!(ok, "{shown}");
    assert!(!shown.contains(ETCD_PASSWORD), "{shown}");

    let first = DelayqProcess::start(&delayq_bin(), "a", &config).expect("start a");
    eventually(Duration::from_secs(20), "a leads", || async {
        leads(&first).await.then_some(())
    })
    .await;
    let second = DelayqProcess::start(&delayq_bin(), "b", &config).expect("start b");
    delivered_among(&first, &[&second], &redis, "before").await;
    assert!(!leads(&second).await, "{}", second.log());

    first.signal(SIGKILL);
    eventually(Duration::from_secs(20), "b leads", || async {
        leads(&second).await.then_some(())
    })
    .await;
    delivered_among(&second, &[&first], &redis, "after").await;
    for log in [first.log(), second.log()] {
        assert!(
            !log.contains(ETCD_PASSWORD) && !log.contains("s3cret-pw"),
            "{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_server_name_password_or_permission_is_refused_naming_its_setting() {
    let pki = Pki::new().expect("a CA and its certificates");
    let etcd = etcd(&pki).await;
    let redis = RedisServer::start().expect("redis");
    #[rustfmt::skip]
    let cases = [
        ("other-ca.pem", ETCD_PASSWORD, "", "etcd.tls_ca_file"),
        ("ca.pem", ETCD_PASSWORD, "tls_server_name = \"elsewhere.example\"", "etcd.tls_server_name"),
        ("ca.pem", "not-the-password", "", "etcd.password_file"),
        ("ca.pem", ETCD_PASSWORD, "#nobody", "etcd.user needs read and write on the election prefix /delayq/default/leader/"),
    ];
    for (ca, password, extra, named) in cases {
        let mut etcd_section = section(&etcd, &pki, ca, password, extra);
        if extra == "#nobody" {
            etcd_section = etcd_section.replace("user = \"dq\"", "user = \"nobody\"");
        }
        let config = format!(
            "[redis]\nurl = \"{}\"\nshards = 2\n{etcd_section}",
            redis.url()
        );
        assert!(check_config(&config).0, "{config}");
        let mut node = DelayqProcess::start(&delayq_bin(), "refused", &config).expect("start");
        let log = eventually(Duration::from_secs(20), named, || async {
            let log = node.log();
            log.contains(named).then_some(log)
        })
        .await;
        assert!(
            !log.contains(password) || password == ETCD_PASSWORD,
            "{log}"
        );
        assert!(!log.contains(ETCD_PASSWORD), "{log}");
        assert!(!leads(&node).await, "{log}");
        // No crash loop: the instance stays up, a standby that keeps trying.
        let (status, _) = Api::new(node.api).get("/healthz").await;
        assert_eq!(status, 200, "{log}");
        assert!(node.is_running(), "{log}");
    }
    // The right name for the certificate (it holds "localhost") is taken.
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 2\n{}",
        redis.url(),
        section(
            &etcd,
            &pki,
            "ca.pem",
            ETCD_PASSWORD,
            "tls_server_name = \"localhost\""
        )
    );
    let node = DelayqProcess::start(&delayq_bin(), "named", &config).expect("start");
    eventually(Duration::from_secs(20), "it leads", || async {
        leads(&node).await.then_some(())
    })
    .await;
}

#[test]
fn etcd_tls_and_auth_settings_are_checked_before_anything_connects() {
    let pki = Pki::new().expect("a CA and its certificates");
    let p = |name: &str| pki.path(name).display().to_string();
    std::fs::write(pki.path("pw"), "pw\n").unwrap();
    let ok = format!(
        "endpoints = [\"https://a:2379\", \"https://b:2379\"]\n{}user = \"dq\"\npassword_file = \"{}\"\ntls_server_name = \"etcd.internal\"",
        pki.settings("ca.pem", true),
        p("pw")
    );
    #[rustfmt::skip]
    let cases: Vec<(String, Option<&str>)> = vec![
        (ok.clone(), None),
        ("endpoints = [\"https://a:2379\"]".into(), None),
        ("endpoints = [\"http://a:2379\", \"https://b:2379\"]".into(), Some("etcd.endpoints")),
        ("endpoints = [\"grpc://a:2379\"]".into(), Some("etcd.endpoints")),
        (format!("endpoints = [\"http://a:2379\"]\ntls_ca_file = \"{}\"", p("ca.pem")), Some("etcd.tls_ca_file")),
        ("endpoints = [\"http://a:2379\"]\ntls_server_name = \"x\"".into(), Some("etcd.tls_server_name")),
        ("endpoints = [\"https://a:2379\"]\ntls_server_name = \"\"".into(), Some("etcd.tls_server_name")),
        (format!("endpoints = [\"https://a:2379\"]\ntls_ca_file = \"{}\"", p("missing.pem")), Some("etcd.tls_ca_file")),
        (format!("endpoints = [\"https://a:2379\"]\ntls_ca_file = \"{}\"", p("client-key.pem")), Some("etcd.tls_ca_file")),
        (format!("endpoints = [\"https://a:2379\"]\ntls_cert_file = \"{}\"", p("client.pem")), Some("etcd.tls_key_file")),
        (format!("endpoints = [\"https://a:2379\"]\ntls_key_file = \"{}\"", p("client-key.pem")), Some("etcd.tls_cert_file")),
        (format!("endpoints = [\"https://a:2379\"]\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"", p("client.pem"), p("ca.pem")), Some("etcd.tls_key_file")),
        ("endpoints = [\"http://a:2379\"]\nuser = \"dq\"".into(), Some("etcd.password_file")),
        (format!("endpoints = [\"http://a:2379\"]\npassword_file = \"{}\"", p("pw")), Some("etcd.user")),
        (format!("endpoints = [\"http://a:2379\"]\nuser = \"\"\npassword_file = \"{}\"", p("pw")), Some("etcd.user")),
        ("endpoints = [\"http://a:2379\"]\nuser = \"dq\"\npassword_file = \"/no/such/file\"".into(), Some("etcd.password_file")),
    ];
    for (etcd, refused) in cases {
        let config = format!("[redis]\nurl = \"redis://127.0.0.1:6379\"\n[etcd]\n{etcd}\n");
        let (ok, shown) = check_config(&config);
        match refused {
            None => assert!(ok, "{etcd}: {shown}"),
            Some(key) => assert!(!ok && shown.contains(key), "{etcd}: {shown}"),
        }
    }
}

#[test]
fn the_drill_drives_a_deployment_with_tls_everywhere_through_its_config() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pki = Pki::new().expect("a CA and its certificates");
    let redis = pki.redis(true).expect("a TLS redis-server");
    let etcd = rt.block_on(etcd(&pki));
    let password = acl_user(&redis, pki.dir.path());
    let config = format!(
        "{}{}",
        config(&redis, &password, &pki.settings("ca.pem", true)),
        section(&etcd, &pki, "ca.pem", ETCD_PASSWORD, "")
    );
    let nodes: Vec<DelayqProcess> = ["d1", "d2"]
        .iter()
        .map(|name| DelayqProcess::start(&delayq_bin(), name, &config).expect("start"))
        .collect();
    let file = pki.path("delayq.toml");
    std::fs::write(&file, &config).unwrap();
    let mut args: Vec<String> = nodes
        .iter()
        .flat_map(|n| {
            [
                "--node".to_owned(),
                format!("{}={}", n.pid().unwrap(), n.url("")),
            ]
        })
        .collect();
    args.extend(["--config".to_owned(), file.display().to_string()]);
    args.extend(crate::ops::drill::ONE_PAUSE.iter().map(|a| a.to_string()));
    let (code, report, stderr) = crate::ops::drill::drill(&args);
    let logs = || -> String {
        nodes
            .iter()
            .map(|n| format!("--- {} ---\n{}", n.url(""), n.full_log()))
            .collect()
    };
    assert_eq!(code, Some(0), "{report:#}\n{stderr}\n{}", logs());
    crate::ops::drill::check_scenario(&report, "pause", 1);
    assert_eq!(report["total"]["lost"], 0, "{report:#}");
    assert!(
        !stderr.contains("s3cret-pw") && !stderr.contains(ETCD_PASSWORD),
        "{stderr}"
    );
}
