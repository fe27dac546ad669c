//! A Sentinel's announcements about this master, read on a subscription of its
//! own to each Sentinel: a failover under way holds commands until the new master
//! is announced (at most [`SWITCH_HOLD`]).

use super::sentinel::upgrade;
use super::*;

/// What a Sentinel announces about the master a connection follows.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::store) enum Announcement {
    /// It is about to promote a replica (`+failover-state-send-slaveof-noone`):
    /// from now on, writes to the old master may be discarded.
    Switching,
    /// Its failover ended without a switch (`-failover-abort-*`).
    Aborted,
    /// The master is now at this address (`+switch-master`).
    Switched { host: String, port: u16 },
}

/// The channels a Sentinel announces on that [`announcement`] reads.
pub(super) const ANNOUNCED: [&str; 2] = ["+switch-master", "+failover-state-send-slaveof-noone"];

pub(super) const ABORTS: &str = "-failover-abort-*";

/// What a Sentinel's message on `channel` says about the master named `master`
/// (None: nothing, or about another master).
pub(in crate::store) fn announcement(
    channel: &str,
    payload: &str,
    master: &str,
) -> Option<Announcement> {
    let words: Vec<&str> = payload.split(' ').collect();
    match channel {
        // "<name> <old ip> <old port> <new ip> <new port>"
        "+switch-master" => match words[..] {
            [name, _, _, host, port] if name == master => Some(Announcement::Switched {
                host: host.to_owned(),
                port: port.parse().ok()?,
            }),
            _ => None,
        },
        // "slave <ip>:<port> <ip> <port> @ <name> <master ip> <master port>"
        "+failover-state-send-slaveof-noone" => match words[..] {
            ["slave", _, _, _, "@", name, _, _] if name == master => Some(Announcement::Switching),
            _ => None,
        },
        // "master <name> <ip> <port>"
        _ if channel.starts_with("-failover-abort-") => match words[..] {
            ["master", name, ..] if name == master => Some(Announcement::Aborted),
            _ => None,
        },
        _ => None,
    }
}

/// Listens to one Sentinel's announcements until its connection ends or the
/// connection they are for is dropped.
pub(super) async fn listen(
    current: &Weak<Mutex<Current>>,
    follow: &Weak<Follow>,
    sentinel: usize,
) -> redis::RedisResult<()> {
    let Some(conn) = upgrade(current, follow) else {
        return Ok(());
    };
    let f = conn.sentinel.clone().expect("a Sentinel connection");
    let mut pubsub =
        tokio::time::timeout(f.connect_timeout, f.sentinels[sentinel].get_async_pubsub())
            .await
            .map_err(|_| timeout("no Sentinel answered in time"))??;
    pubsub.subscribe(&ANNOUNCED[..]).await?;
    pubsub.psubscribe(ABORTS).await?;
    // Asked once more now: a switch announced while nobody listened. Until this
    // connection is at the master the Sentinels name, it asks again every second
    // (`unfollowed`): a move that failed (the new master not reached in time, say)
    // is tried again, where the old master, demoted in a planned failover, may go
    // on taking writes for a while without a failed command to say so.
    let mut unfollowed = !conn.follow(true).await;
    let master = f.master.clone();
    drop((conn, f));
    let mut messages = pubsub.into_on_message();
    let mut check = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            message = messages.next() => {
                let Some(message) = message else { return Ok(()) };
                let payload: String = message.get_payload().unwrap_or_default();
                let Some(said) = announcement(message.get_channel_name(), &payload, &master) else {
                    continue;
                };
                let Some(conn) = upgrade(current, follow) else { return Ok(()) };
                let f = conn.sentinel.as_ref().expect("a Sentinel connection");
                match said {
                    Announcement::Switching => {
                        let mut first = false;
                        f.switching.send_modify(|s| {
                            first = s.is_empty();
                            s.insert(sentinel, Instant::now());
                        });
                        if first {
                            tracing::warn!(
                                master,
                                "Sentinel is failing the Redis master over: commands wait for the new master (at most {})",
                                crate::human::duration(SWITCH_HOLD)
                            );
                        }
                    }
                    Announcement::Aborted => {
                        f.switching.send_if_modified(|s| s.remove(&sentinel).is_some());
                    }
                    Announcement::Switched { host, port } => {
                        unfollowed = !conn.follow_to(&host, port).await;
                        f.switching.send_if_modified(|s| {
                            let held = !s.is_empty();
                            s.clear();
                            held
                        });
                    }
                }
            }
            _ = check.tick() => {
                let Some(conn) = upgrade(current, follow) else { return Ok(()) };
                if unfollowed {
                    unfollowed = !conn.follow(true).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_announcement(channel: &str, payload: &str, expected: Option<Announcement>) {
        assert_eq!(
            announcement(channel, payload, "main"),
            expected,
            "{channel} {payload}"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_message_is_read_without_panic_and_only_about_this_master(
            channel in "[-+](switch-master|failover-state-send-slaveof-noone|failover-abort-[a-z-]{0,12}|[a-z-]{0,20})",
            payload in "((main|other|slave|master|@|[0-9.:]{1,15}|\\PC{0,6}) ?){0,9}",
        ) {
            if announcement(&channel, &payload, "main").is_some() {
                proptest::prop_assert!(payload.split(' ').any(|w| w == "main"), "{channel} {payload}");
            }
        }
    }

    #[test]
    fn announcements_about_this_master_are_read_and_others_ignored() {
        let switched = |host: &str, port| {
            Some(Announcement::Switched {
                host: host.into(),
                port,
            })
        };
        let promoting = "+failover-state-send-slaveof-noone";
        check_announcement(
            "+switch-master",
            "main 10.0.0.1 6379 10.0.0.2 6380",
            switched("10.0.0.2", 6380),
        );
        check_announcement("+switch-master", "other 10.0.0.1 6379 10.0.0.2 6380", None);
        check_announcement("+switch-master", "main 10.0.0.1 6379 10.0.0.2 port", None);
        check_announcement("+switch-master", "main 10.0.0.1 6379", None);
        check_announcement("+switch-master", "", None);
        check_announcement(
            promoting,
            "slave 10.0.0.2:6380 10.0.0.2 6380 @ main 10.0.0.1 6379",
            Some(Announcement::Switching),
        );
        check_announcement(
            promoting,
            "slave 10.0.0.2:6380 10.0.0.2 6380 @ mainly 10.0.0.1 6379",
            None,
        );
        check_announcement(promoting, "master main 10.0.0.1 6379", None);
        check_announcement(
            "-failover-abort-not-elected",
            "master main 10.0.0.1 6379",
            Some(Announcement::Aborted),
        );
        check_announcement(
            "-failover-abort-no-good-slave",
            "master main 10.0.0.1 6379",
            Some(Announcement::Aborted),
        );
        check_announcement(
            "-failover-abort-slave-timeout",
            "master other 10.0.0.1 6379",
            None,
        );
        check_announcement("+sdown", "master main 10.0.0.1 6379", None);
        check_announcement(
            "+promoted-slave",
            "slave 10.0.0.2:6380 10.0.0.2 6380 @ main 10.0.0.1 6379",
            None,
        );
    }
}
