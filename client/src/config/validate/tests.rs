//! Tests of validation: refusals name their key, ranges hold at both ends, tokens
//! of every scope, and values filled in during validation.

use std::time::Duration;

use crate::config::Config;
use crate::config::tests::{env, exposed};

#[track_caller]
fn check_err(toml: &str, env_pairs: &[(&str, &str)], expected: &str) {
    let err = Config::from_toml(toml, env(env_pairs))
        .expect_err("should be refused")
        .to_string();
    assert!(
        err.contains(expected),
        "{err:?} should contain {expected:?}"
    );
}

#[test]
fn the_inbox_lives_under_the_prefix_unless_named() {
    for (toml, expected) in [
        ("", ("delayq:inbox", "delayq", "delayq:inbox:rejected")),
        (
            "[redis]\nprefix = \"b\"",
            ("b:inbox", "b", "b:inbox:rejected"),
        ),
        (
            "[redis]\nprefix = \"b\"\n[inbox]\nstream = \"mq\"\ngroup = \"g\"\nrejected_stream = \"r\"",
            ("mq", "g", "r"),
        ),
    ] {
        let c = Config::from_toml(toml, env(&[])).unwrap();
        let inbox = c.inbox.expect("enabled");
        assert_eq!(
            (
                inbox.stream.as_str(),
                inbox.group.as_str(),
                inbox.rejected_stream.as_str()
            ),
            expected,
            "{toml}"
        );
    }
    let (_, table) = Config::effective("[redis]\nprefix = \"b\"", env(&[])).unwrap();
    assert_eq!(table["inbox"]["stream"].as_str(), Some("b:inbox"));
}

#[test]
fn bad_values_name_their_key() {
    check_err(
        "[redis]\nshards = 0",
        &[],
        "redis.shards: must be 1 to 1024 (got 0)",
    );
    check_err("[redis]\nurl = \"http://x\"", &[], "redis.url");
    check_err("[redis]\nprefix = \"a{b\"", &[], "redis.prefix");
    check_err(
        "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nlease_ttl = \"1s\"",
        &[],
        "etcd.lease_ttl",
    );
    check_err(
        "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nlease_ttl = \"2500ms\"",
        &[],
        "etcd.lease_ttl: 2s500ms: must be whole seconds",
    );
    check_err(
        "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nconnect_timeout = \"0s\"",
        &[],
        "etcd.connect_timeout",
    );
    check_err(
        "[etcd]\nendpoints = [\"127.0.0.1:2379\"]",
        &[],
        "etcd.endpoints",
    );
    check_err("[api]\nlisten = \"nowhere\"", &[], "api.listen");
    check_err("[api]\nlisten = \"example.com:7070\"", &[], "api.listen");
    check_err("[api]\nlisten = \"localhost:70000\"", &[], "api.listen");
    let local = Config::from_toml("[api]\nlisten = \"localhost:7071\"", env(&[])).unwrap();
    assert_eq!(local.api.listen.to_string(), "127.0.0.1:7071");
    check_err(
        "[api]\nmax_message_bytes = -1",
        &[],
        "api.max_message_bytes",
    );
    check_err("[forwarder]\nbatch_size = 0", &[], "forwarder.batch_size");
    check_err("[forwarder]\nid_field = \"a b\"", &[], "forwarder.id_field");
    check_err(
        "[forwarder]\nkey_field = \"a b\"",
        &[],
        "forwarder.key_field",
    );
    check_err(
        "[forwarder]\nkey_field = \"delayq-id\"",
        &[],
        "forwarder.key_field: \"delayq-id\" is forwarder.id_field already",
    );
    check_err(
        "[forwarder]\nattempt_field = \"x\"\nid_field = \"x\"",
        &[],
        "forwarder.attempt_field",
    );
    let keyed = Config::from_toml("[forwarder]\nkey_field = \"order-key\"", env(&[])).unwrap();
    assert_eq!(keyed.forwarder.key_field.as_deref(), Some("order-key"));
    assert_eq!(keyed.own_fields().key_field.as_deref(), Some("order-key"));
    check_err(
        "[streams.maxlen]\norders = -5",
        &[],
        "streams.maxlen.orders",
    );
    check_err("[log]\nformat = \"xml\"", &[], "log.format");
    check_err("[redis]\nshard = 3", &[], "redis.shard: unknown key");
    check_err("[redis]\ntimeout = \"soon\"", &[], "redis.timeout");
    check_err("", &[("DELAYQ_REDIS_SHARDS", "0")], "redis.shards");
    check_err("", &[("DELAYQ_API_LISTEN", "x")], "api.listen");
    check_err(
        "[api]\nlisten = \"0.0.0.0:7070\"",
        &[],
        "api.listen: 0.0.0.0:7070 is not loopback and api.tokens is empty",
    );
    check_err("[api]\ntokens = [\"\"]", &[], "api.tokens: an empty token");
    check_err("[api]\ntokens = [\"a b\"]", &[], "api.tokens: a token");
    check_err(
        "[api]\nmax_batch = 0",
        &[],
        "api.max_batch: must be 1 to 5000",
    );
    // Past a bound set for safety, the refusal says why.
    check_err(
        "[api]\nmax_fields = 2001",
        &[],
        "api.max_fields: must be 1 to 2000 (got 2001): one command from a Lua script carries",
    );
    check_err(
        "[forwarder]\nbatch_size = 10001",
        &[],
        "forwarder.batch_size: must be 1 to 10000 (got 10001): a longer batch holds Redis",
    );
    check_err("[api]\nmax_body_bytes = 0", &[], "api.max_body_bytes");
    check_err("[api]\nmax_wait = \"2h\"", &[], "api.max_wait");
    check_err("[api]\nmax_polls = 0", &[], "api.max_polls");
    check_err(
        "[etcd]\nendpoints = [\"http://e:2379\", \"https://f:2379\"]",
        &[],
        "etcd.endpoints: mixes http:// and https://",
    );
    check_err(
        "[redis]\nmin_replicas_acked = 1\nreplicas_ack_timeout = \"2s\"",
        &[],
        "redis.replicas_ack_timeout: must be shorter than redis.timeout",
    );
    check_err("[node]\nid = \" \"", &[], "node.id: must not be empty");
    check_err("[node]\nid = true", &[], "node");
    check_err("[inbox]\nstream = \"\"", &[], "inbox.stream");
    check_err("[inbox]\ngroup = \"a b\"", &[], "inbox.group");
    check_err(
        "[inbox]\nrejected_stream = \"delayq:inbox\"",
        &[],
        "inbox.rejected_stream: must differ",
    );
    check_err("[inbox]\nbatch_size = 0", &[], "inbox.batch_size");
    check_err(
        "[inbox]\nreclaim_after = \"1ms\"",
        &[],
        "inbox.reclaim_after",
    );
    check_err(
        "[delivery]\nmax_attempts = 0",
        &[],
        "delivery.max_attempts: must be 1 to 1000 (got 0)",
    );
    check_err(
        "[delivery]\nack_timeout = \"1ms\"",
        &[],
        "delivery.ack_timeout: must be at least 10ms",
    );
    check_err(
        "[delivery]\nack_timeout = \"2d\"\ngroups = [\"g\"]\n[delivery.streams.orders]",
        &[],
        "delivery.ack_timeout: must be shorter than records.retention (1d) for watched stream \"orders\"",
    );
    check_err(
        "[records]\nretention = \"1m\"\n[delivery.streams.orders]\ngroups = [\"g\"]\nack_timeout = \"90s\"",
        &[],
        "delivery.streams.orders.ack_timeout: must be shorter than records.retention",
    );
    check_err(
        "[delivery]\nbackoff = \"10s\"\nbackoff_max = \"1s\"",
        &[],
        "delivery.backoff_max: must not be shorter than delivery.backoff",
    );
    check_err(
        "[delivery]\nbackoff_jitter = 1.5",
        &[],
        "delivery.backoff_jitter: must be 0 to 1",
    );
    check_err("[delivery]\nsweep_batch = 0", &[], "delivery.sweep_batch");
    check_err(
        "[delivery]\nsweep_interval = \"1ms\"",
        &[],
        "delivery.sweep_interval",
    );
    check_err("[delivery]\ngroups = [\"a b\"]", &[], "delivery.groups");
    check_err(
        "[delivery]\ngroups = [\"g\", \"g\"]",
        &[],
        "delivery.groups: lists a group twice",
    );
    check_err(
        "[delivery.streams.orders]\n",
        &[],
        "delivery.streams.orders.groups: no consumer group to watch",
    );
    check_err(
        "[delivery.streams.orders]\ngroups = []",
        &[],
        "delivery.streams.orders.groups: no consumer group",
    );
    check_err(
        "[delivery.streams.orders]\ngroups = [\"g\"]\nmax_attempts = -1",
        &[],
        "delivery.streams.orders.max_attempts",
    );
    check_err(
        "[delivery.streams.orders]\ngroups = [\"g\"]\nbackoff_jitter = -0.1",
        &[],
        "delivery.streams.orders.backoff_jitter",
    );
    check_err(
        "[delivery.streams.orders]\ngroups = [\"g\"]\nback_off = \"1s\"",
        &[],
        "delivery.streams.orders.back_off: unknown key",
    );
    check_err(
        "[delivery.streams.orders]\ngroups = [\"g\"]\ndead_letter_stream = \"orders\"",
        &[],
        "delivery.streams.orders.dead_letter_stream: must differ",
    );
    check_err(
        "[delivery]\ngroups = [\"g\"]\n[delivery.streams.a]\ndead_letter_stream = \"x\"\n[delivery.streams.b]\ndead_letter_stream = \"x\"",
        &[],
        "dead_letter_stream: \"x\" is also used by stream",
    );
    check_err(
        "[delivery]\ngroups = [\"g\"]\n[delivery.streams.a]\ndead_letter_stream = \"b\"\n[delivery.streams.b]\n",
        &[],
        "delivery.streams.a.dead_letter_stream",
    );
    check_err(
        "[forwarder]\nid_field = \"\"\n[delivery.streams.orders]\ngroups = [\"g\"]",
        &[],
        "forwarder.id_field: must be set while",
    );
    check_err(
        "[forwarder]\nattempt_field = \"\"\n[delivery.streams.orders]\ngroups = [\"g\"]",
        &[],
        "forwarder.attempt_field: must be set while",
    );
    check_err(
        "",
        &[("DELAYQ_DELIVERY_MAX_ATTEMPTS", "0")],
        "delivery.max_attempts",
    );
}

#[test]
fn request_timeout_and_max_concurrent_requests_at_the_ends_of_their_range() {
    let ms = Duration::from_millis;
    /// TOML, environment, and (request_timeout, max_concurrent_requests) or a refusal.
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        Result<(Duration, usize), &'static str>,
    );
    #[rustfmt::skip]
    let cases: [Case; 11] = [
        ("", &[], Ok((ms(30_000), 1024))),
        ("[api]\nrequest_timeout = \"100ms\"", &[], Ok((ms(100), 1024))),
        ("[api]\nrequest_timeout = \"1h\"", &[], Ok((ms(3_600_000), 1024))),
        ("", &[("DELAYQ_API_REQUEST_TIMEOUT", "250ms")], Ok((ms(250), 1024))),
        ("[api]\nmax_concurrent_requests = 1", &[], Ok((ms(30_000), 1))),
        ("", &[("DELAYQ_API_MAX_CONCURRENT_REQUESTS", "100000")], Ok((ms(30_000), 100_000))),
        ("[api]\nrequest_timeout = \"99ms\"", &[], Err("api.request_timeout: 99ms: must be 100ms to 1h")),
        ("[api]\nrequest_timeout = \"1h 1ms\"", &[], Err("api.request_timeout: 1h1ms: must be 100ms to 1h")),
        ("[api]\nrequest_timeout = \"soon\"", &[], Err("request_timeout")),
        ("[api]\nmax_concurrent_requests = 0", &[], Err("api.max_concurrent_requests: must be 1 to 100000 (got 0)")),
        ("[api]\nmax_concurrent_requests = 100001", &[], Err("api.max_concurrent_requests: must be 1 to 100000 (got 100001)")),
    ];
    for (toml, env_pairs, expected) in cases {
        match expected {
            Ok(want) => {
                let c = Config::from_toml(toml, env(env_pairs)).unwrap();
                let got = (c.api.request_timeout, c.api.max_concurrent_requests);
                assert_eq!(got, want, "{toml} {env_pairs:?}");
            }
            Err(part) => check_err(toml, env_pairs, part),
        }
    }
}

#[test]
fn tokens_open_non_loopback_addresses() {
    let c = Config::from_toml(
        "[api]\nlisten = \"0.0.0.0:7070\"",
        env(&[("DELAYQ_API_TOKENS", "s3cret, other")]),
    )
    .unwrap();
    assert_eq!(exposed(&c.api.tokens), ["s3cret", "other"]);
    let c = Config::from_toml("[api]\nlisten = \"[::1]:7070\"", env(&[])).unwrap();
    assert!(c.api.tokens.is_empty());
}

#[test]
fn tokens_of_each_scope_come_from_lists_files_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let (admin, write, read) = (
        file("admin", "a2\n"),
        file("write", "w2\n\n  w3  \n"),
        file("read", "r2"),
    );
    let c = Config::from_toml(
        &format!(
            "[api]\nlisten = \"0.0.0.0:7070\"\ntokens = [\"a1\"]\ntokens_file = \"{admin}\"\n\
             write_tokens = [\"w1\"]\nwrite_tokens_file = \"{write}\"\nread_tokens_file = \"{read}\""
        ),
        env(&[("DELAYQ_API_READ_TOKENS", "r1, r0")]),
    )
    .unwrap();
    assert_eq!(exposed(&c.api.tokens), ["a1", "a2"]);
    assert_eq!(exposed(&c.api.write_tokens), ["w1", "w2", "w3"]);
    assert_eq!(exposed(&c.api.read_tokens), ["r1", "r0", "r2"]);
    // Tokens of a lower scope alone are authentication enough to listen beyond loopback.
    for (toml, env_pairs) in [
        (
            "[api]\nlisten = \"0.0.0.0:7070\"\nread_tokens = [\"r\"]",
            &[][..],
        ),
        (
            "[api]\nlisten = \"0.0.0.0:7070\"",
            &[("DELAYQ_API_WRITE_TOKENS", "w")][..],
        ),
    ] {
        let c = Config::from_toml(toml, env(env_pairs)).unwrap();
        assert!(c.api.tokens.is_empty(), "{toml}");
    }
    #[rustfmt::skip]
    let refusals = [
        ("[api]\nwrite_tokens = [\"\"]", "api.write_tokens: an empty token"),
        ("[api]\nread_tokens = [\"a b\"]", "api.read_tokens: a token: must be non-empty"),
        ("[api]\nread_tokens_file = \"/nonexistent/read\"", "api.read_tokens_file: cannot read /nonexistent/read"),
        ("[api]\nwrite_tokens_file = \"/nonexistent/write\"", "api.write_tokens_file: cannot read"),
        ("[api]\ntokens = [\"t\"]\nwrite_tokens = [\"t\"]", "api.write_tokens: a token is also of a higher scope"),
        ("[api]\ntokens = [\"t\"]\nread_tokens = [\"t\"]", "api.read_tokens: a token is also of a higher scope"),
        ("[api]\nwrite_tokens = [\"t\"]\nread_tokens = [\"u\", \"t\"]", "api.read_tokens: a token is also of a higher scope"),
    ];
    for (toml, expected) in refusals {
        check_err(toml, &[], expected);
    }
    let err = Config::from_toml(
        "[api]\ntokens = [\"t0p\"]\nread_tokens = [\"t0p\"]",
        env(&[]),
    )
    .unwrap_err()
    .to_string();
    assert!(!err.contains("t0p"), "{err}");
}

#[test]
fn per_shard_elections_split_the_shards_into_groups() {
    const ETCD: &str = "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n";
    let single = Config::from_toml(ETCD, env(&[])).unwrap();
    assert_eq!(
        (single.election.per_shard, single.election.groups),
        (false, 1)
    );
    assert_eq!(single.election.rate_share(1000), 1000.0);
    let c = Config::from_toml(
        &format!("{ETCD}[redis]\nshards = 5\n[election]\nmode = \"per_shard\"\ngroups = 2"),
        env(&[]),
    )
    .unwrap();
    assert_eq!(c.election.groups, 2);
    assert_eq!(c.election.shards_of(0, 5), [0, 2, 4]);
    assert_eq!(c.election.shards_of(1, 5), [1, 3]);
    // Together the groups' shares make the limit (0: none), a fraction when the
    // limit is below the number of groups, never 0.
    assert_eq!(
        [0, 1, 999, 1000].map(|r| c.election.rate_share(r)),
        [0.0, 0.5, 499.5, 500.0]
    );
    // Unset: 4 groups, or one per shard when fewer shards; from the environment too.
    for (shards, want) in [(16, 4), (3, 3), (1, 1)] {
        let c = Config::from_toml(
            &format!("{ETCD}[redis]\nshards = {shards}"),
            env(&[("DELAYQ_ELECTION_MODE", "per_shard")]),
        )
        .unwrap();
        assert_eq!(c.election.groups, want, "{shards} shards");
    }
    check_err(
        "[election]\nmode = \"per_shard\"",
        &[],
        "election.mode: \"per_shard\" needs etcd.endpoints",
    );
    check_err(
        &format!("{ETCD}[election]\nmode = \"leaders\""),
        &[],
        "election.mode: \"leaders\": must be \"single\" or \"per_shard\"",
    );
    check_err(
        &format!("{ETCD}[redis]\nshards = 3\n[election]\nmode = \"per_shard\"\ngroups = 4"),
        &[],
        "election.groups: must be 1 to redis.shards (3) (got 4)",
    );
}

#[test]
fn cluster_mode_is_checked_key_by_key() {
    const C: &str = "[redis]\nmode = \"cluster\"\nurl = \"redis://a:7000\"\n";
    // (config, the key the refusal names, or None when accepted)
    for (toml, refused) in [
        (C.to_owned(), None),
        (format!("{C}nodes = [\"b:7001\", \"[::1]:7002\"]"), None),
        (format!("{C}nodes = [\"b\"]"), Some("redis.nodes")),
        (format!("{C}nodes = [\"b:0\"]"), Some("redis.nodes")),
        (format!("{C}shards = 4"), Some("redis.shards")),
        (
            format!("{C}[redis.sentinel]\nmaster = \"m\"\nnodes = [\"s:26379\"]"),
            Some("redis.sentinel"),
        ),
        (
            "[redis]\nmode = \"cluster\"\nurl = \"redis://a:7000/2\"".to_owned(),
            Some("redis.url"),
        ),
        (
            "[redis]\nmode = \"cluster\"\nurl = \"unix:///tmp/r.sock\"".to_owned(),
            Some("redis.url"),
        ),
        ("[redis]\nmode = \"sharded\"".to_owned(), Some("redis.mode")),
        (
            "[redis]\nnodes = [\"b:7001\"]".to_owned(),
            Some("redis.nodes"),
        ),
        (
            format!("{C}[inbox]\nstream = \"in\"\nrejected_stream = \"in:rejected\""),
            Some("inbox.rejected_stream"),
        ),
        (
            format!("{C}[inbox]\nstream = \"{{in}}\"\nrejected_stream = \"{{in}}:rejected\""),
            None,
        ),
        (
            format!(
                "{C}[delivery.streams.orders]\ngroups = [\"g\"]\ndead_letter_stream = \"orders:dead\""
            ),
            Some("delivery.streams.orders.dead_letter_stream"),
        ),
        (
            format!("{C}[delivery.streams.\"a}}b\"]\ngroups = [\"g\"]"),
            Some("delivery.streams.a}b"),
        ),
    ] {
        match (Config::from_toml(&toml, env(&[])), refused) {
            (Ok(_), None) => {}
            (Err(e), Some(key)) => assert!(e.to_string().contains(key), "{toml}: {e}"),
            (Ok(_), Some(key)) => panic!("{toml}: accepted, {key} should be refused"),
            (Err(e), None) => panic!("{toml}: {e}"),
        }
    }
    // What cluster mode fills in: the seeds, one shard per slot, and names in the
    // slots of what they go with.
    let c = Config::from_toml(
        &format!(
            "{C}nodes = [\"b:7001\", \"a:7000\"]\n[delivery.streams.orders]\ngroups = [\"g\"]"
        ),
        env(&[]),
    )
    .unwrap();
    assert_eq!(
        c.redis.cluster,
        Some(vec![("a".to_owned(), 7000), ("b".to_owned(), 7001)])
    );
    assert_eq!(c.redis.shards, crate::store::CLUSTER_SLOTS);
    assert_eq!(c.dead_letter_stream("orders"), "{orders}:dead");
    assert_eq!(c.dead_letter_stream("{t}x"), "{t}x:dead");
    assert_eq!(
        c.inbox.as_ref().unwrap().rejected_stream,
        "{delayq:inbox}:rejected"
    );
    assert_eq!(
        c.target_refusal("a{}b").as_deref(),
        Some(
            "stream \"a{}b\": on Redis Cluster a name with braces must have a hash tag (\"{tag}rest\")"
        )
    );
    assert_eq!(c.target_refusal("{t}b"), None);
    let c = Config::from_toml(
        "",
        env(&[
            ("DELAYQ_REDIS_MODE", "cluster"),
            ("DELAYQ_REDIS_URL", "redis://a:7000"),
            ("DELAYQ_REDIS_NODES", "b:7001,c:7002"),
        ]),
    )
    .unwrap();
    assert_eq!(c.redis.cluster.map(|s| s.len()), Some(3));
    let (_, table) = Config::effective(C, env(&[])).unwrap();
    assert!(table["redis"].get("shards").is_none());
    let (_, table) = Config::effective("", env(&[])).unwrap();
    assert_eq!(table["redis"]["shards"].as_integer(), Some(16));
}

#[test]
fn the_journal_restores_by_itself_unless_told_not_to() {
    let journal = |toml: &str, vars: &[(&str, &str)]| {
        Config::from_toml(toml, env(vars)).unwrap().journal.unwrap()
    };
    let url = "[journal]\nurl = \"mysql://dq@db/delayq\"\n";
    let off = format!("{url}auto_restore = false\ntransitions = false");
    let (on, off) = (journal(url, &[]), journal(&off, &[]));
    assert!(on.auto_restore && on.transitions && !off.auto_restore && !off.transitions);
    assert!(!journal(url, &[("DELAYQ_JOURNAL_AUTO_RESTORE", "false")]).auto_restore);
}

#[test]
fn the_journal_is_checked_key_by_key() {
    // Both retentions at either end of their range, and a step outside it.
    for key in ["retention", "transitions_retention"] {
        for (value, ok) in [
            ("1m", true),
            ("3650d", true),
            ("59s", false),
            ("3651d", false),
        ] {
            let toml = format!("[journal]\nurl = \"mysql://dq@db/delayq\"\n{key} = \"{value}\"");
            match Config::from_toml(&toml, env(&[])) {
                Ok(_) => assert!(ok, "{toml}: accepted"),
                Err(e) => assert!(
                    !ok && e.to_string().contains(&format!("journal.{key}")),
                    "{e}"
                ),
            }
        }
    }
    // (config, the key the refusal names, or None when accepted)
    for (toml, refused) in [
        ("", None),
        ("[journal]\nurl = \"mysql://dq@db:3306/delayq\"", None),
        (
            "[journal]\nurl = \"postgres://dq@db/delayq\"",
            Some("journal.url"),
        ),
        ("[journal]\nurl = \"mysql://dq@db\"", Some("journal.url")),
        (
            "[journal]\nurl = \"mysql://db/delayq\"",
            Some("journal.url"),
        ),
        ("[journal]\nurl = \"not a url\"", Some("journal.url")),
        (
            "[journal]\nurl = \"mysql://dq@db/delayq\"\nauto_restore = \"yes\"",
            Some("auto_restore"),
        ),
        (
            "[journal]\npassword_file = \"p\"",
            Some("journal.password_file"),
        ),
        (
            "[journal]\nurl = \"mysql://dq@db/delayq\"\npassword_file = \"/nonexistent/p\"",
            Some("journal.password_file"),
        ),
    ] {
        match (Config::from_toml(toml, env(&[])), refused) {
            (Ok(_), None) => {}
            (Err(e), Some(key)) => assert!(e.to_string().contains(key), "{toml}: {e}"),
            (Ok(_), Some(key)) => panic!("{toml}: accepted, {key} should be refused"),
            (Err(e), None) => panic!("{toml}: {e}"),
        }
    }
    let c = Config::from_toml("", env(&[])).unwrap();
    assert!(c.journal.is_none(), "off by default");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p");
    std::fs::write(&file, "s3cret\n").unwrap();
    let toml = format!(
        "[journal]\nurl = \"mysql://dq@db/delayq\"\npassword_file = \"{}\"",
        file.display()
    );
    let c = Config::from_toml(&toml, env(&[("DELAYQ_JOURNAL_RETENTION", "7d")])).unwrap();
    let journal = c.journal.unwrap();
    assert_eq!(journal.url.expose(), "mysql://dq:s3cret@db/delayq");
    assert!(!format!("{:?}", journal.url).contains("s3cret"));
    assert_eq!(journal.retention, Duration::from_secs(7 * 86_400));
}
