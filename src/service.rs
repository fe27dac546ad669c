//! Running as a service: tells the service manager (systemd's notify protocol)
//! when the daemon is ready, what it is doing, and that it is alive; rereads the
//! configuration on SIGHUP.
//!
//! Without `NOTIFY_SOCKET` in the environment every notification is a no-op, so
//! the same code runs under systemd, in a container or in a terminal.

use std::path::PathBuf;

use futures::StreamExt;
use sd_notify::NotifyState;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::health::{self, Health, RedisState};
use crate::leadership::{LeaderInfo, Leadership, Role};
use crate::reload::{Reloader, SetLogLevel};

/// Sends notifications; a failure is logged, never fatal (the manager may be gone).
pub fn notify(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none_or(|s| s.is_empty()) {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!(error = %e, "cannot notify the service manager");
    }
}

/// The one-line status shown by `systemctl status`, with what keeps this node from
/// its job, if anything.
pub fn status_line(role: &Role, info: &LeaderInfo, redis: &RedisState) -> String {
    let line = status_of_role(role, info);
    match redis {
        RedisState::Starting | RedisState::Writable => line,
        _ => format!("{line}; {}", redis.problem().unwrap_or_default()),
    }
}

fn status_of_role(role: &Role, info: &LeaderInfo) -> String {
    match role {
        Role::Leader(term) => format!("leader, epoch {} ({})", term.epoch, info.mode),
        Role::Follower => match (&info.node_id, info.epoch) {
            (Some(leader), Some(epoch)) => format!("standby; leader {leader}, epoch {epoch}"),
            (None, Some(epoch)) => format!("standby; no leader (last epoch {epoch})"),
            _ => "standby; no leader known".to_owned(),
        },
    }
}

/// Whether the node has joined its election: standalone, once it took its epoch
/// from Redis (and published it); with etcd, once etcd answered (the election
/// loop campaigns from then on). Until then the node is not ready.
fn joined(role: &Role, info: &LeaderInfo) -> bool {
    match info.mode {
        "" => false,
        "etcd" => role.is_leader() || info.etcd_reachable == Some(true),
        _ => true,
    }
}

/// Announces readiness once the node has joined its election (Redis is reachable
/// by then: [`crate::start`] connected), then keeps `STATUS=` current on every
/// change of role or leader. Returns when `cancel` fires.
pub async fn announce(leadership: Leadership, health: Health, cancel: CancellationToken) {
    let mut roles = leadership.subscribe();
    let mut infos = leadership.info_updates();
    let mut probes = health.updates();
    loop {
        if joined(&roles.borrow_and_update(), &infos.borrow_and_update()) {
            break;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = roles.changed() => if changed.is_err() { return },
            changed = infos.changed() => if changed.is_err() { return },
        }
    }
    let mut last = String::new();
    let mut ready = false;
    loop {
        let role = roles.borrow_and_update().clone();
        let info = infos.borrow_and_update().clone();
        probes.borrow_and_update();
        let status = status_line(&role, &info, &health.redis());
        if !ready {
            notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
            tracing::info!(status = %status, "ready");
            ready = true;
        } else if status != last {
            notify(&[NotifyState::Status(&status)]);
        }
        last = status;
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = roles.changed() => if changed.is_err() { return },
            changed = infos.changed() => if changed.is_err() { return },
            changed = probes.changed() => if changed.is_err() { return },
        }
    }
}

/// Pings the service manager's watchdog (`WatchdogSec=`) while this process is
/// alive: the runtime runs a task spawned for the purpose within half the interval,
/// and the Redis probe loop finished a round recently (its rounds are bounded, so a
/// stale one means the process's loops are stuck). Whether Redis answers does not
/// matter here: a Redis outage must not make the manager restart every instance at
/// once; it shows in readiness, the status line and metrics instead. Returns at once
/// when no watchdog is configured.
pub async fn watchdog(health: Health, cancel: CancellationToken) {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return;
    };
    // Several chances per interval, so one slow round does not cost a restart.
    let every = interval / 4;
    let deadline = interval / 2;
    tracing::info!(interval = ?interval, "watchdog enabled");
    loop {
        let runs = tokio::time::timeout(deadline, tokio::spawn(async {})).await;
        let progress = health.last_round().elapsed();
        match runs {
            Ok(Ok(())) if progress <= health::PROBE_EVERY * 3 + interval => {
                notify(&[NotifyState::Watchdog])
            }
            Ok(_) => tracing::error!(
                last_round_ms = progress.as_millis() as u64,
                "watchdog: the Redis probe loop made no progress; not telling the service manager we are alive"
            ),
            Err(_) => tracing::error!(
                timeout = ?deadline,
                "watchdog: the runtime did not run a task in time; not telling the service manager we are alive"
            ),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Starts [`announce`] and [`watchdog`] for a running daemon.
pub fn supervise(daemon: &crate::Daemon, cancel: CancellationToken) -> Vec<JoinHandle<()>> {
    vec![
        tokio::spawn(announce(
            daemon.leadership.clone(),
            daemon.health.clone(),
            cancel.clone(),
        )),
        tokio::spawn(watchdog(daemon.health.clone(), cancel)),
    ]
}

/// A SIGHUP that comes before `run` listens for it (a reload sent right after the
/// start): noted by a handler installed first thing, so that it does not end the
/// process as SIGHUP does by default, and raised again once `run` listens.
pub struct EarlyHangup {
    seen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handler: Option<signal_hook::SigId>,
}

impl EarlyHangup {
    /// Installs the handler; call it before anything else.
    pub fn install() -> Self {
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handler = signal_hook::flag::register(signal_hook::consts::SIGHUP, seen.clone()).ok();
        EarlyHangup { seen, handler }
    }

    /// Removes the handler once `run` listens, and raises a SIGHUP it saw again.
    fn hand_over(self) {
        if let Some(handler) = self.handler {
            signal_hook::low_level::unregister(handler);
        }
        if self.seen.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = signal_hook::low_level::raise(signal_hook::consts::SIGHUP);
        }
    }
}

/// `delayq run`: starts the daemon, tells the service manager, reloads on SIGHUP,
/// and stops in order on SIGTERM or SIGINT (a second one exits at once).
/// `config_file` and `effective` are what the configuration was read from, for
/// reloads; without a file, SIGHUP only logs that there is nothing to reread.
pub async fn run(
    config: Config,
    config_file: Option<(PathBuf, toml::Table)>,
    set_log_level: SetLogLevel,
    early: EarlyHangup,
) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook_tokio::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    early.hand_over();
    notify(&[NotifyState::Status("starting: connecting to Redis")]);
    let node_id = config.node_id.clone();
    let mut daemon = crate::start(config).await?;
    let mut http_reloads = daemon.take_reload_requests();
    let cancel = CancellationToken::new();
    let tasks = supervise(&daemon, cancel.clone());
    let mut reloader = config_file.map(|(path, effective)| {
        Reloader::new(path, &effective, daemon.live_config(), set_log_level)
    });
    loop {
        let signal = tokio::select! {
            signal = signals.next() => signal,
            Some(answer) = http_reloads.recv() => {
                // POST /v1/admin/reload: as SIGHUP, and the outcome goes back.
                let outcome = match reloader.as_mut() {
                    // No file to reread: the request is dropped unanswered, which
                    // the API answers 409 no_config_file.
                    None => continue,
                    Some(reloader) => {
                        let outcome = reloader.reload();
                        reloader.report(&outcome);
                        if let Ok(outcome) = &outcome {
                            daemon.audit_token_changes("reload request", outcome).await;
                        }
                        let path = reloader.path().display().to_string();
                        let tls = daemon.reload_tls();
                        outcome
                            .map_err(|e| format!("configuration reload refused; keeping the running configuration: {path}: {e}"))
                            .and_then(|o| tls.map(|()| crate::api::Reloaded::new(node_id.clone(), &o)))
                    }
                };
                let _ = answer.send(outcome);
                continue;
            }
        };
        match signal {
            Some(SIGHUP) => {
                let Some(reloader) = reloader.as_mut() else {
                    tracing::warn!(
                        "SIGHUP: no config file was given (--config); nothing to reload"
                    );
                    continue;
                };
                let now = sd_notify::NotifyState::monotonic_usec_now();
                if let Ok(now) = now {
                    notify(&[NotifyState::Reloading, now]);
                }
                let outcome = reloader.reload();
                reloader.report(&outcome);
                if let Ok(outcome) = &outcome {
                    daemon.audit_token_changes("SIGHUP", outcome).await;
                }
                let _ = daemon.reload_tls();
                notify(&[NotifyState::Ready]);
            }
            Some(sig) => {
                tracing::info!(
                    signal = sig,
                    "signal received; stopping (send again to exit at once)"
                );
                break;
            }
            None => break,
        }
    }
    notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
    tokio::spawn(async move {
        while let Some(sig) = signals.next().await {
            if sig != SIGHUP {
                eprintln!("delayq: second signal; exiting without draining");
                std::process::exit(130);
            }
        }
    });
    cancel.cancel();
    for task in tasks {
        let _ = task.await;
    }
    daemon.stop().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::leadership::Term;

    #[track_caller]
    fn check(role: Role, leader: Option<&str>, epoch: Option<u64>, expected: &str) {
        let info = LeaderInfo {
            node_id: leader.map(str::to_owned),
            epoch,
            mode: "etcd",
            ..LeaderInfo::default()
        };
        assert_eq!(status_line(&role, &info, &RedisState::Writable), expected);
    }

    #[test]
    fn status_lines() {
        let leader = Role::Leader(Term {
            epoch: 7,
            since: SystemTime::now(),
        });
        check(leader, Some("a"), Some(7), "leader, epoch 7 (etcd)");
        check(
            Role::Follower,
            Some("b"),
            Some(9),
            "standby; leader b, epoch 9",
        );
        check(
            Role::Follower,
            None,
            Some(9),
            "standby; no leader (last epoch 9)",
        );
        check(Role::Follower, None, None, "standby; no leader known");
        let info = LeaderInfo::default();
        let refused = RedisState::Refuses("READONLY You can't write".into());
        assert_eq!(
            status_line(&Role::Follower, &info, &refused),
            "standby; no leader known; redis refuses writes: READONLY You can't write"
        );
        let gone = RedisState::Unreachable("connection refused".into());
        assert_eq!(
            status_line(&Role::Follower, &info, &gone),
            "standby; no leader known; redis unreachable: connection refused"
        );
    }

    #[track_caller]
    fn check_joined(mode: &'static str, etcd_reachable: Option<bool>, expected: bool) {
        let info = LeaderInfo {
            mode,
            etcd_reachable,
            ..LeaderInfo::default()
        };
        assert_eq!(joined(&Role::Follower, &info), expected);
    }

    #[test]
    fn joined_once_the_election_answers() {
        check_joined("", None, false);
        check_joined("standalone", None, true);
        check_joined("etcd", Some(false), false);
        check_joined("etcd", Some(true), true);
        let leader = Role::Leader(Term {
            epoch: 3,
            since: SystemTime::now(),
        });
        assert!(joined(
            &leader,
            &LeaderInfo {
                mode: "etcd",
                ..LeaderInfo::default()
            }
        ));
    }
}
