//! Redis Cluster over TLS, as an ACL user: a cluster whose nodes serve TLS (the
//! cluster bus and replication too), every node with the ACL user, and a daemon
//! in `redis.mode = "cluster"` reaching it with a `rediss://` seed, the CA and the
//! password from a file: messages to streams on every master are delivered, and
//! the password shows nowhere.

use std::time::Duration;

use delayq::harness::{DelayqProcess, RedisCluster};
use serde_json::json;

use super::{Pki, acl_user_on, check_config};
use crate::support::{Api, delayq_bin, entries, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_delivers_through_a_tls_cluster_as_an_acl_user() {
    let pki = Pki::new();
    let files = pki.server(false);
    let cluster = tokio::task::spawn_blocking(move || RedisCluster::start_with(3, Some(files)))
        .await
        .unwrap()
        .expect("a TLS Redis Cluster");
    let nodes: Vec<_> = cluster.nodes.iter().collect();
    let password = acl_user_on(&nodes, pki.dir.path());
    let tls_ports: Vec<u16> = cluster
        .nodes
        .iter()
        .map(|n| n.tls_port.expect("a TLS port"))
        .collect();
    let seeds: Vec<String> = tls_ports[1..]
        .iter()
        .map(|p| format!("\"127.0.0.1:{p}\""))
        .collect();
    let config = format!(
        "[redis]\nmode = \"cluster\"\nurl = \"rediss://dq@127.0.0.1:{}\"\nnodes = [{}]\n\
         password_file = \"{}\"\ntls_ca_file = \"{}\"\n",
        tls_ports[0],
        seeds.join(", "),
        password.display(),
        pki.path("ca.pem").display()
    );
    let (ok, shown) = check_config(&config);
    assert!(ok, "{shown}");
    assert!(!shown.contains("s3cret-pw"), "{shown}");
    let node = DelayqProcess::start(&delayq_bin(), "tls-cluster", &config).expect("start delayq");
    let api = Api::new(node.api);
    let streams = ["tls-a", "tls-b", "tls-c", "tls-d", "tls-e", "tls-f"];
    for stream in streams {
        let (status, body) = api
            .post(
                "/v1/messages",
                json!({"stream": stream, "payload": "over TLS", "delay": "10ms"}),
            )
            .await;
        assert_eq!(status, 201, "{body}\n{}", node.log());
    }
    // Read back over the plain ports (the test's own client), following the slots.
    let mut conn = redis::cluster::ClusterClient::new(cluster.urls())
        .and_then(|c| c.get_connection())
        .expect("a plain cluster connection");
    let found = within(Duration::from_secs(15), || {
        let all = streams.iter().all(|s| entries(&mut conn, s).len() == 1);
        std::future::ready(all.then_some(()))
    })
    .await;
    assert!(
        found.is_some(),
        "not every message delivered; the log:\n{}",
        node.log()
    );
    let masters: std::collections::BTreeSet<usize> = streams
        .iter()
        .map(|s| cluster.master_of(delayq::store::slot_of(s)).unwrap())
        .collect();
    assert_eq!(masters.len(), 3, "the streams reach every master");
    assert!(!node.log().contains("s3cret-pw"), "{}", node.log());
}
