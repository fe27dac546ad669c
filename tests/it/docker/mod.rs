//! The Docker deployment, for real: delayq's image built from docker/Dockerfile
//! (its `prebuilt` target, with the daemon the suite was built with) on base images made
//! from Debian's packages by docker/local-images.sh, which also starts a Docker
//! engine when none answers; then docker/compose.yaml brought up under a project
//! name of its own, its ports on free loopback ports, and failed over: the leader
//! killed, the next one stopped, Redis restarted, and `delayq drill` run against
//! it. Everything the project created is removed at the end, failure or not.
//!
//! This test needs a Docker engine it can start (root, `docker.io` and
//! `debootstrap`, which `.ci/install-deps --tests` installs) and fails, saying why, when
//! there is none. The compose command is `docker compose` when that works, else
//! `docker-compose`; DELAYQ_TEST_COMPOSE (e.g. "docker-compose") chooses.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use delayq_harness::free_port;
use serde_json::{Value, json};
use tokio::process::Command;

use crate::support::{
    Api, Deliveries, OneLeader, delayq_bin, eventually, panics, patience, repo, text,
};

const SERVICES: [&str; 7] = [
    "redis", "etcd-1", "etcd-2", "etcd-3", "delayq-1", "delayq-2", "delayq-3",
];
const NODES: [&str; 3] = ["delayq-1", "delayq-2", "delayq-3"];
/// Made by docker/local-images.sh: Debian's redis-server and etcd.
const SERVERS_IMAGE: &str = "delayq-local/servers:bookworm";
const IMAGE: &str = "delayq:e2e";

async fn run(program: &str, args: &[&str], env: &[(String, String)]) -> Output {
    Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

#[track_caller]
fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

async fn docker(args: &[&str]) -> String {
    ok(&format!("docker {args:?}"), run("docker", args, &[]).await)
}

/// A Docker engine, the local base images and `IMAGE`, or a clear failure.
async fn images() {
    // The daemon these tests were built with (local-images.sh strips it): what
    // the image carries is under test, not how fast it was compiled, and a release
    // build beside the suite would cost it minutes of both cores.
    let binary = delayq_bin();
    let started = Instant::now();
    let script = Command::new(repo().join("docker/local-images.sh"))
        .arg(&binary)
        .env("DELAYQ_IMAGE", IMAGE)
        .kill_on_drop(true)
        .output();
    // Making the base images takes a few minutes, once; a run that waits on
    // another's lock gives up after 15.
    let out = tokio::time::timeout(Duration::from_secs(20 * 60), script)
        .await
        .expect("docker/local-images.sh did not finish within 20 minutes")
        .expect("run docker/local-images.sh");
    assert!(
        out.status.success(),
        "no Docker engine or images: docker/local-images.sh failed ({}); this test needs \
         docker.io and debootstrap (.ci/install-deps --tests) and root to start dockerd:\n{}",
        out.status,
        text(&out.stderr)
    );
    remove_leftovers().await;
    eprintln!(
        "engine and images ready in {:.1?}; {IMAGE} is {}",
        started.elapsed(),
        docker(&["image", "inspect", "-f", "{{.Size}}", IMAGE])
            .await
            .trim()
            .parse::<u64>()
            .map(|b| format!("{:.1} MB", b as f64 / 1e6))
            .unwrap_or_default()
    );
}

/// Removes what an earlier run of these tests left behind when it was killed
/// before its `down` (its containers, networks and volumes): projects named
/// `delayq-e2e-<pid>…` whose process is gone.
async fn remove_leftovers() {
    const PREFIX: &str = "delayq-e2e-";
    let label = "label=com.docker.compose.project";
    let projects = docker(&[
        "ps",
        "-a",
        "--filter",
        label,
        "--format",
        "{{.Label \"com.docker.compose.project\"}}",
    ])
    .await;
    let mut gone: Vec<&str> = projects
        .lines()
        .filter(|p| {
            p.strip_prefix(PREFIX)
                .and_then(|rest| rest.split('-').next()?.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect();
    gone.sort_unstable();
    gone.dedup();
    for project in gone {
        let filter = format!("label=com.docker.compose.project={project}");
        eprintln!("removing {project}, left by a run that was killed");
        let containers = docker(&["ps", "-aq", "--filter", &filter]).await;
        let containers: Vec<&str> = containers.split_whitespace().collect();
        if !containers.is_empty() {
            let _ = run(
                "docker",
                &[&["rm", "-f", "-v"][..], &containers].concat(),
                &[],
            )
            .await;
        }
        for kind in ["network", "volume"] {
            let names = docker(&[kind, "ls", "-q", "--filter", &filter]).await;
            for name in names.split_whitespace() {
                let _ = run("docker", &[kind, "rm", name], &[]).await;
            }
        }
    }
}

/// The compose CLIs: Debian's `docker-compose` 1.x, and `docker compose` v2.
#[derive(Clone, Copy, Debug)]
enum Compose {
    V1,
    V2,
}

/// The command of `wanted`, or of the other one when `wanted` is not installed
/// (`DELAYQ_TEST_COMPOSE` chooses one for every test).
async fn compose_cli(wanted: Compose) -> Vec<String> {
    if let Ok(chosen) = std::env::var("DELAYQ_TEST_COMPOSE") {
        return chosen.split_whitespace().map(str::to_owned).collect();
    }
    let v1 = vec!["docker-compose".to_owned()];
    let v2 = vec!["docker".to_owned(), "compose".to_owned()];
    let works = |cli: Vec<String>| async move {
        let ok = Command::new(&cli[0])
            .args(&cli[1..])
            .arg("version")
            .output()
            .await
            .is_ok_and(|o| o.status.success());
        ok.then_some(cli)
    };
    let (first, second) = match wanted {
        Compose::V1 => (v1, v2),
        Compose::V2 => (v2, v1),
    };
    let cli = match works(first).await {
        Some(cli) => cli,
        None => works(second).await.expect("a compose CLI"),
    };
    eprintln!("{wanted:?} wanted, running {}", cli.join(" "));
    cli
}

/// A compose project of docker/compose.yaml (and overrides); `down -v` when dropped.
struct Deployment {
    cli: Vec<String>,
    project: String,
    /// The compose files, docker/compose.yaml first.
    files: Vec<String>,
    env: Vec<(String, String)>,
    token: String,
    redis_port: u16,
    ports: [u16; 3],
    _secrets: tempfile::TempDir,
}

impl Deployment {
    async fn up() -> Deployment {
        Self::up_with(&[], Compose::V1).await
    }

    /// The deployment with `overrides` (files under docker/) over compose.yaml,
    /// under a project name of its own.
    async fn up_with(overrides: &[&str], cli: Compose) -> Deployment {
        let d = Self::prepared(overrides, cli).await;
        ok("compose up", d.compose(&["up", "-d", "--no-build"]).await);
        d
    }

    /// [`Deployment::up_with`] before its `up`: nothing of the project left.
    async fn prepared(overrides: &[&str], cli: Compose) -> Deployment {
        let secrets = tempfile::tempdir().unwrap();
        let token = format!("e2e-{}", ulid::Ulid::new());
        let file = secrets.path().join("api-tokens");
        std::fs::write(&file, format!("{token}\n")).unwrap();
        // Bind-mounted as it is: the containers' user (uid 10001) reads it.
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        panics::install();
        // Below the ephemeral range: `docker start` binds them again after a kill.
        let redis_port = free_port();
        let ports = [free_port(), free_port(), free_port()];
        let mut env = vec![
            ("API_TOKENS_FILE".into(), file.display().to_string()),
            ("DELAYQ_IMAGE".into(), IMAGE.into()),
            ("REDIS_IMAGE".into(), SERVERS_IMAGE.into()),
            ("ETCD_IMAGE".into(), SERVERS_IMAGE.into()),
            ("REDIS_PORT".into(), redis_port.to_string()),
        ];
        for (n, port) in ports.iter().enumerate() {
            env.push((format!("DELAYQ_PORT_{}", n + 1), port.to_string()));
        }
        let files = std::iter::once("compose.yaml")
            .chain(overrides.iter().copied())
            .map(|f| repo().join("docker").join(f).display().to_string())
            .collect();
        let d = Deployment {
            cli: compose_cli(cli).await,
            project: format!(
                "delayq-e2e-{}{}",
                std::process::id(),
                if overrides.is_empty() { "" } else { "-x" }
            ),
            files,
            env,
            token,
            redis_port,
            ports,
            _secrets: secrets,
        };
        // A project of the same name left by a run that could not clean up.
        d.compose(&["down", "-v", "--remove-orphans", "-t", "1"])
            .await;
        d
    }

    /// Leaves a key in the project's volume `volume`, as a run of another
    /// variant, or an earlier run, would.
    async fn leave_data_in(&self, volume: &str) {
        let volume = format!("{}_{volume}", self.project);
        docker(&[
            "run",
            "--rm",
            "-v",
            &format!("{volume}:/data"),
            SERVERS_IMAGE,
            "sh",
            "-c",
            "redis-server --dir /data --appendonly yes --daemonize yes \
             && until redis-cli ping; do sleep 0.1; done \
             && redis-cli set left-over 1 && redis-cli shutdown",
        ])
        .await;
    }

    async fn compose(&self, args: &[&str]) -> Output {
        let mut all: Vec<&str> = self.cli[1..].iter().map(String::as_str).collect();
        all.extend(["-p", &self.project]);
        for file in &self.files {
            all.extend(["-f", file]);
        }
        all.extend(args);
        // docker-compose 1.x gives dockerd 60 s an answer by default; creating
        // containers on the vfs storage driver beside other work took longer.
        let mut env = self.env.clone();
        env.push(("COMPOSE_HTTP_TIMEOUT".to_owned(), "600".to_owned()));
        run(&self.cli[0], &all, &env).await
    }

    /// The container of a service, by name (what `docker kill` takes).
    async fn container(&self, service: &str) -> String {
        let id = ok("compose ps", self.compose(&["ps", "-q", service]).await);
        let id = id.trim();
        assert!(!id.is_empty(), "no container for {service}");
        docker(&["inspect", "-f", "{{.Name}}", id])
            .await
            .trim()
            .trim_start_matches('/')
            .to_owned()
    }

    /// Each node's API, with the token from the secret.
    fn apis(&self) -> Vec<Api> {
        self.ports
            .iter()
            .map(|port| {
                Api::new(format!("127.0.0.1:{port}"))
                    .with_token(&self.token)
                    .with_timeout(Duration::from_secs(3))
            })
            .collect()
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        // Drop may run inside the test's runtime: tear down on a thread of its own.
        let (cli, project, env) = (self.cli.clone(), self.project.clone(), self.env.clone());
        let files = self.files.clone();
        let failed = std::thread::panicking();
        let failure = panics::take_last().filter(|_| failed);
        std::thread::spawn(move || {
            let compose = |args: &[&str]| {
                std::process::Command::new(&cli[0])
                    .args(&cli[1..])
                    .args(["-p", &project])
                    .args(files.iter().flat_map(|f| ["-f", f.as_str()]))
                    .args(args)
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .output()
            };
            if failed && let Ok(out) = compose(&["logs", "--no-color", "--tail", "40"]) {
                eprintln!("--- compose logs ---\n{}", text(&out.stdout));
            }
            // The logs bury the failure: it comes again, last.
            if let Some(failure) = &failure {
                eprintln!("--- compose logs end; the test failed: {failure}");
            }
            match compose(&["down", "-v", "--remove-orphans", "-t", "2"]) {
                Ok(out) if out.status.success() => {}
                Ok(out) => eprintln!("compose down {project}: {}", text(&out.stderr)),
                Err(e) => eprintln!("compose down {project}: {e}"),
            }
        })
        .join()
        .ok();
    }
}

/// Waits until Docker reports every named service's container healthy.
async fn healthy(d: &Deployment, services: &[&str]) {
    let mut containers = Vec::new();
    for s in services {
        containers.push(d.container(s).await);
    }
    eventually(Duration::from_secs(120), "containers healthy", || async {
        let mut args = vec!["inspect", "-f", "{{.State.Health.Status}}"];
        args.extend(containers.iter().map(String::as_str));
        let out = run("docker", &args, &[]).await;
        let states = text(&out.stdout);
        if out.status.success() && states.lines().all(|s| s == "healthy") {
            return Some(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        None
    })
    .await;
}

/// The one node that leads with an epoch above `after`, the others that answer
/// agreeing on it.
async fn leader_after(apis: &[Api], after: u64) -> (usize, u64) {
    OneLeader::among(apis)
        .above(after)
        .agreed()
        .within(Duration::from_secs(60))
        .wait(String::new)
        .await
}

/// How long a push refused for now (503) or unanswered is sent again (× patience).
const SEND_AGAIN_FOR: Duration = Duration::from_secs(60);

/// Pushes `count` messages to `stream` through `api`, due `spread` apart from now
/// on; returns the ids the API confirmed.
async fn push(api: &Api, stream: &str, count: usize, spread: Duration) -> Vec<String> {
    let mut confirmed = Vec::new();
    for i in 0..count {
        // Ids take no braces; a stream's name may (a hash tag).
        let id = format!("{}-{i}", stream.replace(['{', '}'], ""));
        let body = json!({
            "id": id,
            "stream": stream,
            "payload": format!("message {i}"),
            "delay_ms": (spread * i as u32).as_millis() as u64,
        });
        // As a producer does, a push answered with nothing (the machine stalled past
        // the client's timeout) or 503 is sent again with its id, for up to a minute:
        // stored once, it then answers 200 as a duplicate. (Redis here syncs every
        // write to disk, `appendfsync always`, and beside the other compose test's
        // containers on the same disk it has stood still for 13 s: every node's
        // calls timed out, five tries of a push with them.)
        let give_up = Instant::now() + SEND_AGAIN_FOR * patience();
        let mut tries = 0;
        let (status, answer) = loop {
            tries += 1;
            let again = Instant::now() < give_up;
            match api.try_post("/v1/messages", &body).await {
                Ok((503, answer)) if again => eprintln!("push {id}: 503 {answer}: sent again"),
                Err(e) if again => eprintln!("push {id}: no answer ({e:?}): sent again"),
                Ok(answer) => break answer,
                Err(e) => panic!("push {id}: no answer in {tries} tries: {e:?}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let stored = status == 201 || (tries > 1 && status == 200 && answer["duplicate"] == true);
        assert!(stored, "push {id} (try {tries}): {status} {answer}");
        confirmed.push(id);
    }
    confirmed
}

/// Kills or stops `node`'s container (`how` is the docker verb) while watching
/// for a takeover; returns the new leader and the time from the command to it.
async fn fail_over(
    d: &Deployment,
    apis: &[Api],
    how: &str,
    node: usize,
    epoch: u64,
) -> (usize, u64, Duration) {
    let container = d.container(NODES[node]).await;
    let started = Instant::now();
    let mut args = vec![how];
    if how == "stop" {
        args.extend(["-t", "20"]);
    }
    args.push(&container);
    let (stopped, (taken, took)) = tokio::join!(run("docker", &args, &[]), async {
        let taken = leader_after(apis, epoch).await;
        (taken, started.elapsed())
    });
    ok(&format!("docker {how} {container}"), stopped);
    assert_ne!(taken.0, node, "a different node leads after docker {how}");
    (taken.0, taken.1, took)
}

/// Starts `node`'s container again and waits until it is healthy and a standby
/// that names the leader every node agrees on; returns that leader and its epoch.
/// Usually the one that took over; under a load that stalls Redis for longer than
/// a leader may go unheard, leadership may have moved on meanwhile, as it should.
async fn back_as_standby(d: &Deployment, apis: &[Api], node: usize) -> (usize, u64) {
    let container = d.container(NODES[node]).await;
    docker(&["start", &container]).await;
    healthy(d, &[NODES[node]]).await;
    eventually(
        Duration::from_secs(30),
        "the old leader a standby that names the leader the others agree on",
        || async {
            let (leader, epoch) = OneLeader::among(apis).agreed().now().await?;
            let (_, view) = apis[node].try_get("/v1/leader").await?;
            (leader != node
                && view["is_leader"] == false
                && view["leader"]["node_id"] == NODES[leader])
                .then_some((leader, epoch))
        },
    )
    .await
}

/// Every node is known by its name on the compose network (`api.advertise`), not the
/// 0.0.0.0 it listens on: in the leader's entry as `standby` sees it, and in the
/// registry.
async fn known_by_name(apis: &[Api], leader: usize, standby: usize) {
    let address = format!("{}:7070", NODES[leader]);
    eventually(
        Duration::from_secs(30),
        "the leader known by name",
        || async {
            let (_, view) = apis[standby].try_get("/v1/leader").await?;
            (view["leader"]["address"] == address.as_str()).then_some(())
        },
    )
    .await;
    let listed = |nodes: &serde_json::Value| -> Vec<(String, String)> {
        let all = nodes["nodes"].as_array().cloned().unwrap_or_default();
        let mut listed: Vec<_> = all
            .iter()
            .map(|n| (n["node_id"].to_string(), n["address"].to_string()))
            .collect();
        listed.sort();
        listed
    };
    let want: Vec<(String, String)> = NODES
        .iter()
        .map(|n| (format!("{n:?}"), format!("\"{n}:7070\"")))
        .collect();
    eventually(
        Duration::from_secs(30),
        "every node registered by name",
        || async {
            let (_, nodes) = apis[standby].try_get("/v1/nodes").await?;
            (listed(&nodes) == want).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_deployment_survives_kill_stop_and_a_redis_restart_in_containers() {
    let started = Instant::now();
    images().await;
    let d = Deployment::up().await;
    healthy(&d, &SERVICES).await;
    eprintln!(
        "deployment {} healthy after {:.1?}",
        d.project,
        started.elapsed()
    );
    let apis = d.apis();
    // Every endpoint under /v1 wants the token from the secret.
    let (anonymous, _) = apis[0].call("GET", "/v1/leader", None, None).await;
    assert_eq!(anonymous, 401);

    let (first, epoch) = leader_after(&apis, 0).await;
    let standby = (first + 1) % NODES.len();
    known_by_name(&apis, first, standby).await;
    let mut confirmed: Vec<(&str, Vec<String>)> = Vec::new();
    // Due across the crash takeover (lease TTL 6 s) and after it.
    let ids = push(&apis[standby], "e2e-kill", 40, Duration::from_millis(250)).await;
    confirmed.push(("e2e-kill", ids));

    // Crash: SIGKILL, the lease runs out, a standby takes over.
    let (second, _, kill_takeover) = fail_over(&d, &apis, "kill", first, epoch).await;
    eprintln!(
        "docker kill {}: {} leads after {kill_takeover:.2?}",
        NODES[first], NODES[second]
    );
    let ids = push(
        &apis[second],
        "e2e-after-kill",
        20,
        Duration::from_millis(100),
    )
    .await;
    confirmed.push(("e2e-after-kill", ids));
    let (second, epoch) = back_as_standby(&d, &apis, first).await;

    // Handover: SIGTERM resigns on the way out.
    let other = (0..NODES.len()).find(|&n| n != second).unwrap();
    let ids = push(&apis[other], "e2e-term", 30, Duration::from_millis(100)).await;
    confirmed.push(("e2e-term", ids));
    let (third, _, term_takeover) = fail_over(&d, &apis, "stop", second, epoch).await;
    eprintln!(
        "docker stop {}: {} leads after {term_takeover:.2?}",
        NODES[second], NODES[third]
    );
    let (third, _) = back_as_standby(&d, &apis, second).await;

    // Redis restarts (SIGTERM, then its append-only file): nothing scheduled is
    // lost, and the nodes reconnect on their own.
    let ids = push(&apis[third], "e2e-redis", 30, Duration::from_millis(200)).await;
    confirmed.push(("e2e-redis", ids));
    let redis = d.container("redis").await;
    docker(&["restart", "-t", "10", &redis]).await;
    healthy(&d, &SERVICES).await;
    let ids = push(
        &apis[third],
        "e2e-after-redis",
        10,
        Duration::from_millis(100),
    )
    .await;
    confirmed.push(("e2e-after-redis", ids));

    let redis_url = format!("redis://127.0.0.1:{}", d.redis_port);
    for (stream, ids) in &confirmed {
        let (tally, _) = Deliveries::new(&redis_url, &[stream])
            .exactly_once(ids, Duration::from_secs(60))
            .await;
        tally.assert_exact(stream);
    }

    // The drill against the deployment: a crash and a handover under load.
    let mut args = vec![
        "drill".to_owned(),
        "--json".into(),
        "--scenarios".into(),
        "kill,term".into(),
        "--rounds".into(),
        "1".into(),
        "--rate".into(),
        "20".into(),
        "--redis-url".into(),
        redis_url.clone(),
        "--kill-cmd".into(),
        "docker kill {node}".into(),
        "--term-cmd".into(),
        "docker stop -t 20 {node}".into(),
        "--start-cmd".into(),
        "docker start {node}".into(),
    ];
    for (n, service) in NODES.iter().enumerate() {
        args.push("--node".into());
        args.push(format!(
            "{}={}",
            d.container(service).await,
            apis[n].url("")
        ));
    }
    let drill_started = Instant::now();
    let out = Command::new(delayq_bin())
        .args(&args)
        .env("DELAYQ_TOKEN", &d.token)
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "drill --json: {e}\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    assert!(
        out.status.success(),
        "drill failed: {report:#}\n{}",
        text(&out.stderr)
    );
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(report["total"]["lost"], 0, "{report:#}");
    assert_eq!(report["total"]["duplicated"], 0, "{report:#}");
    for scenario in ["kill", "term"] {
        let row = report["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["scenario"] == scenario)
            .unwrap_or_else(|| panic!("no {scenario} row: {report:#}"));
        assert_eq!(row["leader_changes"], 1, "{report:#}");
        eprintln!(
            "drill {scenario}: takeover {} ms, {} sent, {} delivered",
            row["takeover"]["median_ms"], row["messages"]["sent"], row["messages"]["delivered"]
        );
    }
    eprintln!(
        "drill took {:.1?}; the whole test {:.1?}",
        drill_started.elapsed(),
        started.elapsed()
    );
}

/// docker/compose.cluster.yaml over compose.yaml: six Redis Cluster nodes joined by
/// a one-shot container, three instances in `redis.mode = "cluster"`. A node's
/// volume left with data makes `up` fail at once, saying so; the standalone
/// variant's data left in its volume changes nothing (the variants start in either
/// order). Pushes to streams across the masters are forwarded once each; the
/// leader's container is killed and the next leader forwards the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_cluster_variant_forwards_through_redis_cluster() {
    const REDIS: [&str; 6] = [
        "redis", "redis-2", "redis-3", "redis-4", "redis-5", "redis-6",
    ];
    let started = Instant::now();
    images().await;
    // With compose v2 where it is installed: the other test runs Debian's 1.x.
    let d = Deployment::prepared(&["compose.cluster.yaml"], Compose::V2).await;
    d.leave_data_in("redis-2-data").await;
    let refused = Instant::now();
    let out = d.compose(&["up", "-d", "--no-build"]).await;
    assert!(
        !out.status.success(),
        "up over a node with data: {}",
        text(&out.stdout)
    );
    let said = text(
        &d.compose(&["logs", "--no-color", "redis-cluster"])
            .await
            .stdout,
    );
    assert!(
        said.contains("cannot form the cluster: redis-2 holds 1 keys") && said.contains("down -v"),
        "{said}\n{}",
        text(&out.stderr)
    );
    // It failed because the init refused, not because something waited it out
    // (the time depends on how fast Docker starts six containers; printed).
    assert!(
        text(&out.stderr).contains("redis-cluster"),
        "up failed for another reason: {}",
        text(&out.stderr)
    );
    eprintln!("up refused after {:.1?}", refused.elapsed());
    ok("compose down", d.compose(&["down", "-v", "-t", "1"]).await);
    // The standalone variant's Redis data, as its `down` (without -v) leaves it.
    d.leave_data_in("redis-data").await;
    ok("compose up", d.compose(&["up", "-d", "--no-build"]).await);
    let mut services: Vec<&str> = REDIS.to_vec();
    services.extend(NODES);
    healthy(&d, &services).await;
    eprintln!(
        "cluster deployment {} healthy after {:.1?}",
        d.project,
        started.elapsed()
    );
    let apis = d.apis();
    let (first, epoch) = leader_after(&apis, 0).await;
    let standby = (first + 1) % NODES.len();
    known_by_name(&apis, first, standby).await;
    let streams = ["c-orders", "c-payments", "c-mail", "{c-t}x"];
    let mut confirmed = Vec::new();
    for stream in streams {
        confirmed.push((
            stream,
            push(&apis[standby], stream, 10, Duration::from_millis(200)).await,
        ));
    }
    let (second, _, took) = fail_over(&d, &apis, "kill", first, epoch).await;
    eprintln!(
        "docker kill {}: {} leads after {took:.2?}",
        NODES[first], NODES[second]
    );
    let (_, stats) = apis[second].get("/v1/stats").await;
    assert!(
        stats["pending"]["per_slot"].is_object() || stats["pending"]["total"] == 0,
        "{stats}"
    );

    // Read through a node's redis-cli in cluster mode (-c follows redirections).
    let node = d.container("redis").await;
    for (stream, ids) in &confirmed {
        eventually(
            Duration::from_secs(60),
            &format!("{stream} complete"),
            || async {
                let out = run(
                    "docker",
                    &["exec", &node, "redis-cli", "-c", "XLEN", stream],
                    &[],
                )
                .await;
                (text(&out.stdout).trim() == ids.len().to_string()).then_some(())
            },
        )
        .await;
        let out = docker(&["exec", &node, "redis-cli", "-c", "XRANGE", stream, "-", "+"]).await;
        for id in ids {
            assert_eq!(
                out.lines().filter(|l| l.trim() == id).count(),
                1,
                "{id} in {stream}: {out}"
            );
        }
        let (status, view) = apis[second].get(&format!("/v1/messages/{}", ids[0])).await;
        assert_eq!(
            (status, view["state"].as_str()),
            (200, Some("delivered")),
            "{view}"
        );
    }
}
