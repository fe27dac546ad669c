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
use crate::leadership::{LeaderInfo, Leadership, Role};
use crate::reload::{Reloader, SetLogLevel};
use crate::store::Store;

/// Sends notifications; a failure is logged, never fatal (the manager may be gone).
pub fn notify(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none_or(|s| s.is_empty()) {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!(error = %e, "cannot notify the service manager");
    }
}

/// The one-line status shown by `systemctl status`.
pub fn status_line(role: &Role, info: &LeaderInfo) -> String {
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
pub async fn announce(leadership: Leadership, cancel: CancellationToken) {
    let mut roles = leadership.subscribe();
    let mut infos = leadership.info_updates();
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
        let status = status_line(&role, &info);
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
        }
    }
}

/// Pings the service manager's watchdog (`WatchdogSec=`) while the process is
/// healthy: this task got scheduled (the runtime is not wedged) and Redis
/// answered through the shared connection (the one every loop and handler uses)
/// within half the watchdog interval. A hung process stops pinging and is
/// restarted. Returns at once when no watchdog is configured.
pub async fn watchdog(store: Store, cancel: CancellationToken) {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return;
    };
    // Several chances per interval, so one slow answer does not cost a restart.
    let every = interval / 4;
    let deadline = interval / 2;
    tracing::info!(interval = ?interval, "watchdog enabled");
    loop {
        match tokio::time::timeout(deadline, store.ping()).await {
            Ok(Ok(())) => notify(&[NotifyState::Watchdog]),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "watchdog: Redis does not answer; not telling the service manager we are alive")
            }
            Err(_) => {
                tracing::warn!(timeout = ?deadline, "watchdog: Redis did not answer in time; not telling the service manager we are alive")
            }
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
        tokio::spawn(announce(daemon.leadership.clone(), cancel.clone())),
        tokio::spawn(watchdog(daemon.store.clone(), cancel)),
    ]
}

/// `delayq run`: starts the daemon, tells the service manager, reloads on SIGHUP,
/// and stops in order on SIGTERM or SIGINT (a second one exits at once).
/// `config_file` and `effective` are what the configuration was read from, for
/// reloads; without a file, SIGHUP only logs that there is nothing to reread.
pub async fn run(
    config: Config,
    config_file: Option<(PathBuf, toml::Table)>,
    set_log_level: SetLogLevel,
) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook_tokio::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    notify(&[NotifyState::Status("starting: connecting to Redis")]);
    let daemon = crate::start(config).await?;
    let cancel = CancellationToken::new();
    let tasks = supervise(&daemon, cancel.clone());
    let mut reloader = config_file.map(|(path, effective)| {
        Reloader::new(path, &effective, daemon.live_config(), set_log_level)
    });
    loop {
        match signals.next().await {
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
                reloader.reload_and_log();
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
        assert_eq!(status_line(&role, &info), expected);
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
