//! The service manager protocol: a stand-in for systemd's notification socket
//! hears readiness, the status line following the role and Redis, watchdog pings
//! (also through a Redis outage, never from a hung process) and the stop.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use delayq_harness::{DelayqProcess, EtcdServer, RedisServer};

use crate::support::{delayq_bin, etcd_config, patience};

/// A stand-in for systemd's notification socket: collects what the daemon sends.
struct NotifySocket {
    _dir: tempfile::TempDir,
    path: PathBuf,
    socket: UnixDatagram,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        NotifySocket {
            _dir: dir,
            path,
            socket,
        }
    }

    /// Messages received within `wait`.
    fn receive_for(&self, wait: Duration) -> Vec<String> {
        self.receive_timed(wait)
            .into_iter()
            .map(|(_, m)| m)
            .collect()
    }

    /// Messages received within `wait`, each with when it came.
    fn receive_timed(&self, wait: Duration) -> Vec<(Instant, String)> {
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            if let Ok(n) = self.socket.recv(&mut buf) {
                out.push((
                    Instant::now(),
                    String::from_utf8_lossy(&buf[..n]).into_owned(),
                ));
            }
        }
        out
    }

    /// Waits for `n` messages containing `needle` (at most `timeout` × patience);
    /// returns every message until then.
    fn wait_count(&self, needle: &str, n: usize, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout * patience();
        let mut seen: Vec<String> = Vec::new();
        while Instant::now() < deadline {
            seen.extend(self.receive_for(Duration::from_millis(100)));
            if seen.iter().filter(|m| m.contains(needle)).count() >= n {
                return seen;
            }
        }
        panic!("fewer than {n} {needle:?} from the daemon within {timeout:?}; got {seen:?}");
    }

    /// Waits for a message containing `needle`; returns every message until then.
    fn wait_for(&self, needle: &str, timeout: Duration) -> Vec<String> {
        self.wait_until(needle, |m| m.contains(needle), timeout)
    }

    /// Waits for a message that `wanted` accepts (`what` names it in a failure);
    /// returns every message until then.
    fn wait_until(
        &self,
        what: &str,
        wanted: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Vec<String> {
        let deadline = Instant::now() + timeout * patience();
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            seen.extend(self.receive_for(Duration::from_millis(100)));
            if seen.iter().any(|m| wanted(m)) {
                return seen;
            }
        }
        panic!("no {what:?} from the daemon; got {seen:?}");
    }
}

#[test]
fn tells_the_service_manager_ready_status_and_alive_through_a_redis_outage() {
    let mut redis = RedisServer::start().unwrap();
    let notify = NotifySocket::bind();
    let mut node = DelayqProcess::start_with_env(
        &delayq_bin(),
        "notified",
        &format!(
            "[redis]\nurl = \"{}\"\nshards = 2\ntimeout = \"300ms\"\n",
            redis.url()
        ),
        &[
            ("NOTIFY_SOCKET", notify.path.to_str().unwrap()),
            ("WATCHDOG_USEC", "800000"),
        ],
    )
    .unwrap();

    let seen = notify.wait_for("READY=1", Duration::from_secs(10));
    let ready = seen.iter().find(|m| m.contains("READY=1")).unwrap();
    assert!(
        ready.contains("STATUS=leader, epoch 1 (standalone)"),
        "{seen:?}"
    );
    // Alive: several pings within a few watchdog intervals.
    notify.wait_count("WATCHDOG=1", 3, Duration::from_secs(2));

    // Redis gone for longer than the watchdog interval: the process itself is fine,
    // so it keeps vouching for itself (no restart storm), and says what is wrong.
    redis.kill();
    notify.wait_for("redis unreachable", Duration::from_secs(10));
    // Three seconds of outage, almost four watchdog intervals: pings all along (the
    // daemon pings every quarter interval; the bound is generous, two intervals, so
    // that only pings that stop fail it).
    let outage = notify.receive_timed(Duration::from_secs(3));
    let pings: Vec<Instant> = outage
        .iter()
        .filter(|(_, m)| m.contains("WATCHDOG=1"))
        .map(|(at, _)| *at)
        .collect();
    assert!(pings.len() >= 3, "{outage:?}");
    let longest = pings.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(
        longest < Duration::from_millis(1600) * patience(),
        "{longest:?} between watchdog pings while Redis was down"
    );
    assert!(
        !outage
            .iter()
            .any(|(_, m)| m.contains("STATUS=") && !m.contains("redis")),
        "the status kept naming the outage: {outage:?}"
    );

    // Redis back: the status says so.
    redis.restart().unwrap();
    notify.wait_until(
        "a leader status without a Redis problem",
        |m| m.contains("STATUS=leader, epoch") && !m.contains("redis"),
        Duration::from_secs(10),
    );

    // A hung process (SIGSTOP) sends nothing.
    node.signal(libc::SIGSTOP);
    let _ = notify.receive_for(Duration::from_millis(200));
    let hung = notify.receive_for(Duration::from_secs(1) * patience());
    assert!(hung.is_empty(), "sent while stopped: {hung:?}");
    node.signal(libc::SIGCONT);
    notify.wait_for("WATCHDOG=1", Duration::from_secs(10));

    // SIGTERM: STOPPING=1, then a clean exit.
    node.signal(libc::SIGTERM);
    notify.wait_for("STOPPING=1", Duration::from_secs(10));
    // One signal only: a second one means "exit at once", which is not what is tested.
    let status = node.wait_exit(Duration::from_secs(15) * patience());
    assert!(status.is_some_and(|s| s.success()), "{}", node.log());
}

#[test]
fn status_follows_leadership_in_an_etcd_pair() {
    let redis = RedisServer::start().unwrap();
    let etcd = EtcdServer::start().unwrap();
    let config = etcd_config(&redis.url(), &[etcd.endpoint()], "");
    let (first_socket, second_socket) = (NotifySocket::bind(), NotifySocket::bind());
    let start = |name: &str, socket: &NotifySocket| {
        DelayqProcess::start_with_env(
            &delayq_bin(),
            name,
            &config,
            &[("NOTIFY_SOCKET", socket.path.to_str().unwrap())],
        )
        .unwrap()
    };
    let mut first = start("first", &first_socket);
    // Ready once the election answered; then the status follows the role.
    let mut seen = first_socket.wait_for("READY=1", Duration::from_secs(10));
    if !seen.iter().any(|m| m.contains("STATUS=leader, epoch")) {
        seen = first_socket.wait_for("STATUS=leader, epoch", Duration::from_secs(10));
    }
    assert!(seen.join("|").contains("(etcd)"), "{seen:?}");

    let second = start("second", &second_socket);
    let seen = second_socket.wait_for("READY=1", Duration::from_secs(10));
    let ready = seen.iter().find(|m| m.contains("READY=1")).unwrap();
    assert!(
        ready.contains("STATUS=standby; leader first, epoch"),
        "{seen:?}\n{}",
        second.log()
    );

    // The leader goes; the standby's status says it leads now.
    first.kill();
    second_socket.wait_for("STATUS=leader, epoch", Duration::from_secs(10));
}
