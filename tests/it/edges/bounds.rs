//! Each bound of each numeric setting as `delayq check-config` sees it: the bound
//! accepted, one step outside refused, naming the key.

use super::config_text;

/// A key set to a value, and whether `check-config` must accept it.
type Bound = (&'static str, &'static str, bool);

#[rustfmt::skip]
const BOUNDS: &[Bound] = &[
    ("redis.shards", "1", true), ("redis.shards", "1024", true),
    ("redis.shards", "0", false), ("redis.shards", "1025", false),
    // No upper bound on durations unless stated; the lower ones:
    ("redis.timeout", "\"50ms\"", true), ("redis.timeout", "\"49ms\"", false),
    ("api.max_message_bytes", "1", true), ("api.max_message_bytes", "67108864", true),
    ("api.max_message_bytes", "0", false), ("api.max_message_bytes", "67108865", false),
    ("api.max_fields", "1", true), ("api.max_fields", "2000", true),
    ("api.max_fields", "0", false), ("api.max_fields", "2001", false),
    ("api.max_batch", "1", true), ("api.max_batch", "5000", true),
    ("api.max_batch", "0", false), ("api.max_batch", "5001", false),
    // 1 GiB of body is not sent in a test: the bound is checked here.
    ("api.max_body_bytes", "1", true), ("api.max_body_bytes", "1073741824", true),
    ("api.max_body_bytes", "0", false), ("api.max_body_bytes", "1073741825", false),
    ("api.max_polls", "1", true), ("api.max_polls", "10000", true),
    ("api.max_polls", "0", false), ("api.max_polls", "10001", false),
    ("api.max_wait", "\"0s\"", true), ("api.max_wait", "\"1h\"", true), ("api.max_wait", "\"3601s\"", false),
    ("api.request_timeout", "\"100ms\"", true), ("api.request_timeout", "\"1h\"", true),
    ("api.request_timeout", "\"99ms\"", false), ("api.request_timeout", "\"3601s\"", false),
    ("api.max_concurrent_requests", "1", true), ("api.max_concurrent_requests", "100000", true),
    ("api.max_concurrent_requests", "0", false), ("api.max_concurrent_requests", "100001", false),
    ("api.max_delay", "\"1ms\"", true), ("api.max_delay", "\"0s\"", false),
    ("api.max_delay", "\"36500days\"", true), ("api.max_delay", "\"36501days\"", false),
    ("redis.connect_timeout", "\"50ms\"", true), ("redis.connect_timeout", "\"49ms\"", false),
    ("redis.min_replicas_acked", "0", true), ("redis.min_replicas_acked", "64", true),
    ("redis.min_replicas_acked", "-1", false), ("redis.min_replicas_acked", "65", false),
    // At most 60s (and below redis.timeout when replicas are asked for: a unit test).
    ("redis.replicas_ack_timeout", "\"1ms\"", true), ("redis.replicas_ack_timeout", "\"60s\"", true),
    ("redis.replicas_ack_timeout", "\"0s\"", false), ("redis.replicas_ack_timeout", "\"61s\"", false),
    ("streams.default_maxlen", "0", true), ("streams.default_maxlen", "9223372036854775807", true),
    ("streams.default_maxlen", "-1", false),
    ("streams.maxlen.orders", "0", true), ("streams.maxlen.orders", "-1", false),
    ("forwarder.batch_size", "1", true), ("forwarder.batch_size", "10000", true),
    ("forwarder.batch_size", "0", false), ("forwarder.batch_size", "10001", false),
    ("forwarder.idle_wakeup", "\"10ms\"", true), ("forwarder.idle_wakeup", "\"9ms\"", false),
    ("api.audit_length", "0", true), ("api.audit_length", "1000000", true),
    ("api.audit_length", "-1", false), ("api.audit_length", "1000001", false),
    ("metrics.max_streams", "1", true), ("metrics.max_streams", "10000", true),
    ("metrics.max_streams", "0", false), ("metrics.max_streams", "10001", false),
    ("forwarder.max_rate", "0", true), ("forwarder.max_rate", "10000000", true),
    ("forwarder.max_rate", "-1", false), ("forwarder.max_rate", "10000001", false),
    ("streams.max_rate.orders", "1", true), ("streams.max_rate.orders", "10000000", true),
    ("streams.max_rate.orders", "0", false), ("streams.max_rate.orders", "10000001", false),
    // A stream's key field: a plain name, "" for none, never a field every entry has.
    ("streams.key_field.orders", "\"order-key\"", true), ("streams.key_field.orders", "\"\"", true),
    ("streams.key_field.orders", "\"a b\"", false), ("streams.key_field.orders", "\"delayq-id\"", false),
    ("records.trim_interval", "\"100ms\"", true), ("records.trim_interval", "\"99ms\"", false),
    ("records.retention", "\"0s\"", true), ("records.retention", "\"3650days\"", true),
    ("records.retention", "\"3651days\"", false),
    ("records.layout", "\"compact\"", true), ("records.layout", "\"hash\"", true),
    ("records.layout", "\"list\"", false),
    ("records.finished_list", "true", true), ("records.finished_list", "false", true),
    ("records.finished_list", "\"no\"", false),
    ("pending.layout", "\"compact\"", true), ("pending.layout", "\"hash\"", true),
    ("pending.layout", "\"list\"", false),
    ("delivery.ack_timeout", "\"10ms\"", true), ("delivery.ack_timeout", "\"9ms\"", false),
    ("delivery.max_attempts", "1", true), ("delivery.max_attempts", "1000", true),
    ("delivery.max_attempts", "0", false), ("delivery.max_attempts", "1001", false),
    ("delivery.backoff_jitter", "0.0", true), ("delivery.backoff_jitter", "1.0", true),
    ("delivery.backoff_jitter", "-0.01", false), ("delivery.backoff_jitter", "1.01", false),
    ("delivery.sweep_interval", "\"10ms\"", true), ("delivery.sweep_interval", "\"9ms\"", false),
    ("delivery.sweep_batch", "1", true), ("delivery.sweep_batch", "10000", true),
    ("delivery.sweep_batch", "0", false), ("delivery.sweep_batch", "10001", false),
    ("inbox.batch_size", "1", true), ("inbox.batch_size", "5000", true),
    ("inbox.batch_size", "0", false), ("inbox.batch_size", "5001", false),
    ("inbox.reclaim_after", "\"100ms\"", true), ("inbox.reclaim_after", "\"99ms\"", false),
    ("etcd.lease_ttl", "\"2s\"", true), ("etcd.lease_ttl", "\"1s\"", false), ("etcd.lease_ttl", "\"2500ms\"", false),
    ("etcd.lease_ttl", "\"1h\"", true), ("etcd.lease_ttl", "\"3601s\"", false),
    ("etcd.connect_timeout", "\"100ms\"", true), ("etcd.connect_timeout", "\"99ms\"", false),
    ("election.mode", "\"single\"", true), ("election.mode", "\"per_shard\"", true),
    ("election.mode", "\"leaders\"", false),
    // With `election.mode = "per_shard"` and the default 16 shards:
    ("election.groups", "1", true), ("election.groups", "16", true),
    ("election.groups", "0", false), ("election.groups", "17", false),
];

#[tokio::test]
async fn check_config_accepts_each_bound_and_refuses_one_step_outside_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, &(key, value, ok)) in BOUNDS.iter().enumerate() {
        let mut settings = vec![(key, value)];
        if key.starts_with("etcd.") || key.starts_with("election.") {
            settings.push(("etcd.endpoints", "[\"http://127.0.0.1:2379\"]"));
        }
        if key == "election.groups" {
            settings.push(("election.mode", "\"per_shard\""));
        }
        let path = dir.path().join(format!("{i}.toml"));
        std::fs::write(&path, config_text("redis://127.0.0.1:6379", &settings))
            .expect("write config");
        let out = crate::support::delayq_with_config(&["check-config", "--quiet"], &path).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if ok {
            assert_eq!(
                out.status.code(),
                Some(0),
                "{key} = {value} must be accepted: {stderr}"
            );
        } else {
            assert_eq!(
                out.status.code(),
                Some(64),
                "{key} = {value} must be refused: {stderr}"
            );
            assert!(
                stderr.contains(&format!("{key}: ")),
                "{key} = {value}: the error names the key: {stderr}"
            );
        }
    }
}
