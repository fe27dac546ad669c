//! The producer crate's dependency tree: `delayq-client` (what a producer depends
//! on) must not pull in any of the daemon's crates, nor the daemon itself. The
//! check reads `cargo tree` and compiles nothing; `.ci/run` also lints that crate
//! built alone (`cargo clippy -p delayq-client`), so it keeps compiling.

use std::collections::BTreeSet;
use std::process::Command;

/// Crates only the daemon needs: etcd (and its gRPC stack, which needs protoc), the
/// HTTP server and client, the OpenAPI generator, the CLI, the metrics exporters,
/// service-manager glue, the journal's MySQL driver, the benchmark's progress bars
/// and the crates of the daemon and its test harness.
const SERVER_ONLY: &[&str] = &[
    "delayq",
    "delayq-harness",
    "mysql_async",
    "etcd-client",
    "tonic",
    "tonic-build",
    "prost",
    "prost-build",
    "h2",
    "hyper",
    "hyper-util",
    "axum",
    "axum-core",
    "tower",
    "tower-http",
    "reqwest",
    "clap",
    "clap_derive",
    "metrics",
    "metrics-exporter-prometheus",
    "metrics-process",
    "hdrhistogram",
    "sd-notify",
    "signal-hook",
    "signal-hook-tokio",
    "indicatif",
    "tempfile",
    "utoipa",
    "utoipa-gen",
    "utoipa-axum",
];

/// The normal (not build, not dev) dependencies of `delayq-client`, by name.
fn client_tree() -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--package",
            "delayq-client",
            "--edges",
            "normal",
            "--prefix",
            "none",
            "--manifest-path",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        ])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_client_library_has_none_of_the_daemons_crates() {
    let tree = client_tree();
    // The tree was read: the client's own crates are in it.
    for needed in ["delayq-client", "redis", "tokio"] {
        assert!(tree.contains(needed), "{needed} missing from {tree:?}");
    }
    let found: Vec<&str> = SERVER_ONLY
        .iter()
        .copied()
        .filter(|name| tree.contains(*name))
        .collect();
    assert!(
        found.is_empty(),
        "`delayq-client` depends on the daemon's {found:?}; \
         what needs them belongs in the daemon (`delayq`)"
    );
}
