//! Crash takeover: a standby that sees the leader gone from Redis ends the
//! leader's lease, so the election moves on at once instead of waiting out the TTL.
//!
//! Every node holds a presence in Redis while it campaigns or leads (see
//! `store::presence`): a subscription that dies with its process, and a health
//! probe it writes every second. A standby polls the leader's signs and suspects it
//! when either fails:
//! - *gone*: nobody is subscribed to the leader's presence channel (its process
//!   died, or its connection to Redis broke), or
//! - *silent*: the leader's probe has not written for [`SILENT`] (it cannot reach
//!   Redis, or it is stopped) while this standby's own probe writes.
//!
//! A suspicion counts only while this standby itself reaches Redis and has held
//! its own presence long enough for the leader's to have been made again after a
//! Redis restart (or has seen the leader's beside its own on the connection it
//! holds now), and only once it has lasted [`CONFIRM`] over two polls or more.
//! etcd is then asked who leads: if it is still the suspected lease, the standby
//! revokes it. A wrong suspicion costs a term, never a message: the revoked leader
//! sees its lease gone and steps down, and the fence refuses anything it still
//! sends. A leader that is merely slow (a Redis stall, a short pause) keeps its
//! subscription and writes its probe again within [`SILENT`], so it is left alone.

use super::*;
use crate::store::{Held, LeaderSigns, Store};

/// How often a standby reads the leader's signs.
pub(super) const POLL: Duration = Duration::from_millis(50);
/// How long a suspicion must last before it is acted on.
const CONFIRM: Duration = Duration::from_millis(100);
/// How long this node's own presence must have been held before it judges a
/// missing one (after a Redis restart every node connects again, each within
/// the presence loop's backoff of at most half a second), unless it has seen the
/// leader's presence beside its own since: then the leader's was made again (or
/// never lost), and its going is a death, not a Redis restart. A standby that
/// has just started (restarted after a crash, say) sees the leader's at its first
/// polls, so it need not wait this out before judging.
const GRACE: Duration = Duration::from_secs(2);
/// How long a leader's probe may go unwritten (it writes every second) before the
/// leader is taken to be cut off from Redis.
pub const SILENT: Duration = Duration::from_millis(3_000);
/// How recently this standby's own probe must have written for it to count as
/// writing. Probes write every [`crate::health::PROBE_EVERY`], each at its own
/// phase, so when Redis stops taking writes from everybody at once the leader's
/// last write may precede this node's by up to a round: a standby judges the
/// leader silent only while its own probe has been fresh (at most 1.5 rounds
/// old) at every poll for [`SILENT`]. Then the leader missed writes this node
/// made, rather than Redis refusing everybody (OOM, READONLY) or having just
/// come back from doing so, when whoever probes first must not judge the others.
const FRESH: Duration = Duration::from_millis(1_500);
/// Logged once a standby has seen the leader's presence beside its own (once per
/// leader lease and own presence): from then on it judges the leader's going
/// without waiting out `GRACE`.
pub const LEADER_IN_SIGHT: &str =
    "the leader's presence is in sight: a leader gone from Redis is replaced at once";
/// After ending a lease, how long to let the election move before judging again.
const COOLDOWN: Duration = Duration::from_millis(250);

/// Why a standby suspects the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Suspicion {
    /// Nobody is subscribed to the leader's presence channel.
    Gone,
    /// The leader's probe has not written for this long (None: no probe key).
    Silent(Option<Duration>),
}

/// What one poll saw.
#[derive(Clone, Copy, Debug)]
pub(super) struct Seen {
    /// The leader's signs.
    pub(super) signs: LeaderSigns,
    /// This node's own signs: a standby whose own presence is not in this Redis
    /// (Redis restarted and it has not subscribed again yet) judges nobody.
    pub(super) own: LeaderSigns,
    /// How long this node's own presence has been held on its connection.
    pub(super) own_presence: Duration,
    /// Whether a poll has found the leader's presence beside this node's own on
    /// that connection.
    pub(super) leader_seen: bool,
    /// How long this node's own probe has been found fresh (see [`FRESH`]) at
    /// every poll.
    pub(super) own_writing: Duration,
}

/// The suspicion one poll supports, if any.
pub(super) fn suspect(seen: &Seen) -> Option<Suspicion> {
    if !seen.own.present {
        return None;
    }
    if !seen.signs.present {
        let settled = seen.own_presence >= GRACE || seen.leader_seen;
        return settled.then_some(Suspicion::Gone);
    }
    let own_writes =
        seen.own.probe_age.is_some_and(|age| age < FRESH) && seen.own_writing >= SILENT;
    let leader_silent = seen.signs.probe_age.is_none_or(|age| age >= SILENT);
    if own_writes && leader_silent && seen.own_presence >= SILENT {
        return Some(Suspicion::Silent(seen.signs.probe_age));
    }
    None
}

/// Suspicions over successive polls of one leader lease.
#[derive(Debug, Default)]
pub(super) struct Judge {
    /// The lease suspected and since when.
    since: Option<(i64, Instant)>,
}

impl Judge {
    /// Takes one poll of `lease`; says the suspicion once it has lasted [`CONFIRM`].
    pub(super) fn poll(
        &mut self,
        lease: i64,
        now: Instant,
        suspicion: Option<Suspicion>,
    ) -> Option<Suspicion> {
        let Some(suspicion) = suspicion else {
            self.since = None;
            return None;
        };
        match self.since {
            Some((l, since)) if l == lease => {
                (now.duration_since(since) >= CONFIRM).then_some(suspicion)
            }
            _ => {
                self.since = Some((lease, now));
                None
            }
        }
    }

    pub(super) fn reset(&mut self) {
        self.since = None;
    }
}

/// What a standby watches the leader with.
pub(super) struct Watcher {
    pub(super) client: Client,
    pub(super) config: EtcdConfig,
    pub(super) store: Store,
    pub(super) node_id: String,
    /// Who leads, with which lease (as etcd says, see `observe`).
    pub(super) info: watch::Receiver<LeaderInfo>,
    pub(super) role: watch::Receiver<Role>,
    /// This node's own presence.
    pub(super) held: watch::Receiver<Option<Held>>,
}

impl Watcher {
    /// Watches the leader from a standby until `cancel` (see the module doc).
    pub(super) async fn run(self, cancel: CancellationToken) {
        let Watcher {
            client,
            config,
            store,
            node_id,
            info,
            role,
            held,
        } = self;
        let mut judge = Judge::default();
        // The leader lease whose presence a poll found beside this node's own,
        // and that own presence's connection (see `GRACE`).
        let mut beside: Option<(i64, std::time::Instant)> = None;
        // Since when this node's own probe has been fresh at every poll.
        let mut writing_since: Option<Instant> = None;
        // etcd's answer when it named a newer leader than `info` still shows,
        // with the `info` it supersedes (until `info` moves on).
        let mut newer: Option<(Leader, Leader)> = None;
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let from_info = {
                let i = info.borrow();
                i.node_id.clone().zip(i.lease)
            };
            let leader = match (newer.take(), from_info) {
                (Some((stale, answer)), Some(shown)) if stale == shown => {
                    newer = Some((stale, answer.clone()));
                    Some(answer)
                }
                (_, shown) => shown,
            };
            let own = *held.borrow();
            let (Some((leader, lease)), Some(own), false) =
                (leader, own, role.borrow().is_leader())
            else {
                judge.reset();
                writing_since = None;
                continue;
            };
            if leader == node_id || lease == own.lease {
                judge.reset();
                writing_since = None;
                continue;
            }
            let signs = tokio::time::timeout(
                config.connect_timeout,
                store.leader_signs((lease, &leader), (own.lease, &node_id)),
            )
            .await;
            let Ok(Ok((signs, own_signs))) = signs else {
                // This node does not reach Redis now: it judges nobody.
                judge.reset();
                writing_since = None;
                continue;
            };
            let now = Instant::now();
            if signs.present && own_signs.present && beside != Some((lease, own.since)) {
                beside = Some((lease, own.since));
                tracing::info!(%leader, lease, "{LEADER_IN_SIGHT}");
            }
            writing_since = if own_signs.probe_age.is_some_and(|age| age < FRESH) {
                Some(writing_since.unwrap_or(now))
            } else {
                None
            };
            let seen = Seen {
                signs,
                own: own_signs,
                own_presence: own.since.elapsed(),
                leader_seen: beside == Some((lease, own.since)),
                own_writing: writing_since.map_or(Duration::ZERO, |since| now - since),
            };
            let Some(suspicion) = judge.poll(lease, now, suspect(&seen)) else {
                continue;
            };
            judge.reset();
            match end_lease(&client, &config, &leader, lease, suspicion).await {
                Ended::Revoked => {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(COOLDOWN) => {}
                    }
                }
                Ended::NotLeading(now) => {
                    let shown = (leader, lease);
                    newer = now.map(|now| (shown, now));
                }
                Ended::NoAnswer => {}
            }
        }
    }
}

/// A leader as the watcher tells them apart: node id and lease.
type Leader = (String, i64);

/// What came of ending a suspected leader's lease.
enum Ended {
    Revoked,
    /// etcd names another leader (or none): the suspect no longer leads.
    NotLeading(Option<Leader>),
    /// etcd did not answer (or refused the revoke).
    NoAnswer,
}

/// Revokes `lease` if etcd still names it the leader's.
async fn end_lease(
    client: &Client,
    config: &EtcdConfig,
    leader: &str,
    lease: i64,
    suspicion: Suspicion,
) -> Ended {
    let mut election = client.election_client();
    let asked = tokio::time::timeout(
        config.connect_timeout,
        election.leader(config.election_prefix.clone()),
    )
    .await;
    let named = match asked {
        Ok(Ok(resp)) => resp
            .kv()
            .map(|kv| (LeaderValue::parse(kv.value()).node_id, kv.lease())),
        Ok(Err(e)) if e.to_string().contains("election: no leader") => None,
        _ => return Ended::NoAnswer,
    };
    if named.as_ref().is_none_or(|(_, l)| *l != lease) {
        tracing::debug!(leader, now = ?named, "the suspected leader no longer leads");
        return Ended::NotLeading(named);
    }
    let why = match suspicion {
        Suspicion::Gone => {
            "its presence in Redis is gone (process dead or its Redis connection lost)".to_owned()
        }
        Suspicion::Silent(Some(age)) => format!(
            "its health probe has not written to Redis for {} ms (cut off from Redis, or stopped)",
            age.as_millis()
        ),
        Suspicion::Silent(None) => {
            "it has no health probe in Redis (cut off from Redis, or stopped)".to_owned()
        }
    };
    let mut leases = client.lease_client();
    match tokio::time::timeout(config.connect_timeout, leases.revoke(lease)).await {
        Ok(Ok(_)) => {
            metrics::counter!(m::LEASES_ENDED).increment(1);
            tracing::warn!(
                leader,
                lease = format_args!("{lease:x}"),
                "ended the leader's lease: {why}"
            );
            Ended::Revoked
        }
        Ok(Err(e)) => {
            tracing::debug!(
                error = %readable(&e),
                leader,
                "cannot end the leader's lease"
            );
            Ended::NoAnswer
        }
        Err(_) => {
            tracing::debug!(leader, "no answer from etcd when ending the leader's lease");
            Ended::NoAnswer
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A poll's signs: the leader's presence and probe age, this node's presence age,
    /// probe age and presence, and whether it saw the leader's beside its own.
    fn seen(
        (present, leader_probe): (bool, Option<u64>),
        (own_presence, own_probe, own_present): (u64, Option<u64>, bool),
        leader_seen: bool,
    ) -> Seen {
        Seen {
            signs: LeaderSigns {
                present,
                probe_age: leader_probe.map(ms),
            },
            own: LeaderSigns {
                present: own_present,
                probe_age: own_probe.map(ms),
            },
            own_presence: ms(own_presence),
            leader_seen,
            own_writing: ms(own_presence),
        }
    }

    #[track_caller]
    fn check(
        present: bool,
        leader_probe: Option<u64>,
        own_presence: u64,
        own_probe: Option<u64>,
        own_present: bool,
        expected: Option<Suspicion>,
    ) {
        let seen = seen(
            (present, leader_probe),
            (own_presence, own_probe, own_present),
            false,
        );
        assert_eq!(suspect(&seen), expected, "{seen:?}");
    }

    /// A standby whose own presence is `own_presence` ms old and has (or has not)
    /// seen the leader's beside it, polling while the leader's is `present`.
    #[track_caller]
    fn check_seen(
        present: bool,
        own_presence: u64,
        leader_seen: bool,
        expected: Option<Suspicion>,
    ) {
        let seen = seen(
            (present, Some(500)),
            (own_presence, Some(500), true),
            leader_seen,
        );
        assert_eq!(suspect(&seen), expected, "{seen:?}");
    }

    #[test]
    fn a_young_presence_judges_a_leader_it_has_seen_go() {
        use Suspicion::*;
        // Just started, the leader seen at an earlier poll, now gone: judged.
        check_seen(false, 100, true, Some(Gone));
        check_seen(false, 1_999, true, Some(Gone));
        // Never seen on this connection (a Redis restart, the leader not yet back).
        check_seen(false, 100, false, None);
        check_seen(false, 1_999, false, None);
        check_seen(false, 2_000, false, Some(Gone));
        // Seen and still there.
        check_seen(true, 100, true, None);
        check_seen(true, 10_000, true, None);
    }

    #[test]
    fn suspicions_need_signs_and_a_settled_own_presence() {
        use Suspicion::*;
        // A healthy leader.
        check(true, Some(500), 10_000, Some(500), true, None);
        // Its process died: the subscription is gone.
        check(false, Some(500), 10_000, Some(500), true, Some(Gone));
        check(false, None, 2_000, None, true, Some(Gone));
        // Just after a Redis restart not everybody has connected again: no judgement.
        check(false, None, 1_999, Some(100), true, None);
        // Cut off from Redis (its probe stopped) while this node writes.
        check(
            true,
            Some(3_000),
            10_000,
            Some(400),
            true,
            Some(Silent(Some(ms(3_000)))),
        );
        check(true, None, 10_000, Some(400), true, Some(Silent(None)));
        // A pause shorter than SILENT is left alone.
        check(true, Some(2_999), 10_000, Some(400), true, None);
        // Nobody's probe writes (Redis refuses writes): nobody is singled out.
        check(true, Some(5_000), 10_000, Some(5_000), true, None);
        check(true, None, 10_000, None, true, None);
        // Redis stopped taking writes from everybody at once, the leader's last
        // write a round earlier in phase than this node's: still nobody.
        check(true, Some(3_000), 10_000, Some(2_100), true, None);
        check(true, Some(3_400), 10_000, Some(2_500), true, None);
        check(
            true,
            Some(3_000),
            10_000,
            Some(1_499),
            true,
            Some(Silent(Some(ms(3_000)))),
        );
        // After a Redis restart this node's own connection may look old while its
        // presence is not in the new Redis yet: no judgement.
        check(false, None, 10_000, Some(100), false, None);
        check(true, None, 10_000, Some(100), false, None);
        // Own presence too young to judge silence.
        check(true, Some(5_000), 2_999, Some(100), true, None);
    }

    #[test]
    fn a_suspicion_counts_once_it_lasts() {
        let t0 = Instant::now();
        let mut judge = Judge::default();
        let gone = Some(Suspicion::Gone);
        assert_eq!(judge.poll(7, t0, gone), None);
        assert_eq!(judge.poll(7, t0 + ms(50), gone), None);
        assert_eq!(judge.poll(7, t0 + ms(100), gone), gone);
        // A clear poll in between starts over.
        let mut judge = Judge::default();
        assert_eq!(judge.poll(7, t0, gone), None);
        assert_eq!(judge.poll(7, t0 + ms(50), None), None);
        assert_eq!(judge.poll(7, t0 + ms(150), gone), None);
        assert_eq!(judge.poll(7, t0 + ms(250), gone), gone);
        // A new leader lease starts over.
        let mut judge = Judge::default();
        assert_eq!(judge.poll(7, t0, gone), None);
        assert_eq!(judge.poll(8, t0 + ms(200), gone), None);
        assert_eq!(judge.poll(8, t0 + ms(300), gone), gone);
    }
}
