//! Redis Cluster over TLS, as an ACL user: a cluster whose nodes serve TLS (the
//! cluster bus and replication too), every node with the ACL user, and a daemon
//! in `redis.mode = "cluster"` reaching it with a `rediss://` seed, the CA and the
//! password from a file: messages to streams on every master are delivered, and
//! the password shows nowhere. Two daemons are elected through etcd: their
//! presence is held over TLS too, so a SIGKILLed leader is taken over long before
//! its 6 s lease runs out.

use std::time::Duration;

use delayq_harness::{DelayqProcess, EtcdServer, RedisCluster};
use serde_json::json;

use super::{Pki, acl_user_on, check_config};
use crate::support::{
    Api, OneLeader, delayq_bin, entries, kill_and_time_takeover, logs_of, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_delivers_through_a_tls_cluster_as_an_acl_user() {
    let pki = Pki::new().expect("a CA and its certificates");
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
    let etcd = EtcdServer::start().expect("start etcd");
    let config = format!(
        "[redis]\nmode = \"cluster\"\nurl = \"rediss://dq@127.0.0.1:{}\"\nnodes = [{}]\n\
         password_file = \"{}\"\ntls_ca_file = \"{}\"\n\
         [etcd]\nendpoints = [\"{}\"]\nlease_ttl = \"6s\"\n",
        tls_ports[0],
        seeds.join(", "),
        password.display(),
        pki.path("ca.pem").display(),
        etcd.endpoint()
    );
    let (ok, shown) = check_config(&config);
    assert!(ok, "{shown}");
    assert!(!shown.contains("s3cret-pw"), "{shown}");
    let mut nodes: Vec<DelayqProcess> = ["tls-cluster-1", "tls-cluster-2"]
        .into_iter()
        .map(|name| DelayqProcess::start(&delayq_bin(), name, &config).expect("start delayq"))
        .collect();
    let apis: Vec<Api> = nodes
        .iter()
        .map(|n| Api::new(n.api).with_timeout(Duration::from_secs(2)))
        .collect();
    let api = &apis[0];
    let streams = ["tls-a", "tls-b", "tls-c", "tls-d", "tls-e", "tls-f"];
    for stream in streams {
        let (status, body) = api
            .post(
                "/v1/messages",
                json!({"stream": stream, "payload": "over TLS", "delay": "10ms"}),
            )
            .await;
        assert_eq!(status, 201, "{body}\n{}", logs_of(&nodes));
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
        "not every message delivered; the logs:\n{}",
        logs_of(&nodes)
    );
    let masters: std::collections::BTreeSet<usize> = streams
        .iter()
        .map(|s| cluster.master_of(delayq_client::store::slot_of(s)).unwrap())
        .collect();
    assert_eq!(masters.len(), 3, "the streams reach every master");
    assert!(
        !logs_of(&nodes).contains("s3cret-pw"),
        "{}",
        logs_of(&nodes)
    );

    let (leader, epoch) = OneLeader::among(&apis).wait(|| logs_of(&nodes)).await;
    // The standby judges once it has held its presence for 2 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, took) = kill_and_time_takeover(&mut nodes, &apis, (leader, epoch)).await;
    println!("TLS Redis Cluster: the leader SIGKILLed, taken over after {took:?}");
    assert!(
        took < Duration::from_millis(2_500),
        "the takeover waited for the 6 s lease: {took:?}\n{}",
        logs_of(&nodes)
    );
}
