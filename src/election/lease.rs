//! The lease: its timings from the granted TTL, the local deadline on the
//! monotonic clock, the failsafe rule at the deadline, and the keepalive loop that
//! renews it and reports each outcome.

use super::*;

/// Timings of one lease, derived from the TTL etcd granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Timing {
    pub(super) ttl: Duration,
    /// Renewal period, and how long a renewal may wait for its answer.
    pub(super) renew_every: Duration,
    /// Taken off the deadline for clock-rate differences and the forwarder's
    /// batch in flight. Below `renew_every`, so that a renewal that got no answer
    /// has been declared failed before the deadline it would have moved.
    pub(super) margin: Duration,
}

impl Timing {
    pub(super) fn new(ttl: Duration) -> Timing {
        Timing {
            ttl,
            renew_every: ttl / 3,
            margin: (ttl / 4).min(Duration::from_secs(1)),
        }
    }

    /// The local deadline after a renewal sent at `sent` that etcd confirmed.
    pub(super) fn deadline(&self, sent: Instant) -> Instant {
        sent + self.ttl - self.margin
    }
}

/// Lease TTL in the whole seconds etcd grants, rounded up.
pub(super) fn ttl_seconds(ttl: Duration) -> i64 {
    ttl.as_millis().div_ceil(1000).max(1) as i64
}

/// What the keepalive loop last learnt about the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Contact {
    /// etcd confirmed a renewal; the deadline moved.
    Renewed,
    /// The last renewal got no answer from etcd (an error or a timeout).
    Unreachable,
    /// etcd answered that the lease does not exist any more.
    Gone,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct LeaseState {
    pub(super) contact: Contact,
    pub(super) deadline: Instant,
    /// A renewal is sent and neither answered nor timed out yet. Set without
    /// telling the receivers (it changes nothing until a deadline asks).
    pub(super) in_flight: bool,
}

/// What a leader does when its lease deadline passes without a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AtDeadline {
    StepDown,
    /// etcd is unreachable and failsafe is on: nobody else can be elected now,
    /// and the fence stops this node if somebody is.
    KeepLeading,
    /// A renewal is out and its answer, or its timeout, has not been taken in:
    /// decide on what it brings (a timeout comes before the deadline unless the
    /// process could not run, so this waits at most the renewal's own timeout).
    AwaitRenewal,
}

pub(super) fn at_deadline(state: LeaseState, failsafe: bool) -> AtDeadline {
    match (state.contact, failsafe) {
        (Contact::Unreachable, true) => AtDeadline::KeepLeading,
        // Renewed, a renewal out: the keepalive task has not run since its
        // timeout passed (the machine was busy), so whether etcd answers is not
        // known yet.
        (Contact::Renewed, _) if state.in_flight => AtDeadline::AwaitRenewal,
        // `Renewed` at the deadline with no renewal out means none was even sent
        // (the process was stalled): that says nothing about etcd, so step down.
        _ => AtDeadline::StepDown,
    }
}

/// A lease kept alive by its own task; dropping it stops the renewals.
pub(super) struct Lease {
    pub(super) id: i64,
    pub(super) state: watch::Receiver<LeaseState>,
    pub(super) _renewals: DropGuard,
}

impl Lease {
    /// Starts renewing a lease that etcd granted for a request sent at `granted_at`.
    pub(super) fn keep_alive(
        client: Client,
        id: i64,
        timing: Timing,
        granted_at: Instant,
    ) -> Lease {
        let (tx, rx) = watch::channel(LeaseState {
            contact: Contact::Renewed,
            deadline: timing.deadline(granted_at),
            in_flight: false,
        });
        let stop = CancellationToken::new();
        tokio::spawn(renew_lease(
            client,
            id,
            timing,
            granted_at,
            tx,
            stop.clone(),
        ));
        Lease {
            id,
            state: rx,
            _renewals: stop.drop_guard(),
        }
    }

    pub(super) fn state(&self) -> LeaseState {
        *self.state.borrow()
    }

    /// The next news of the lease. Cancel-safe.
    pub(super) async fn changed(&mut self) -> LeaseState {
        if self.state.changed().await.is_err() {
            // The renewals ended (the lease is gone, already reported): no more news.
            std::future::pending::<()>().await;
        }
        *self.state.borrow_and_update()
    }
}

/// Failed renewals, for every lease of the process (one per election group), the
/// place of a failure its lease.
static RENEWALS_FAILED: crate::complaint::Complaint = crate::complaint::Complaint::across(
    "lease",
    "lease renewal failed; etcd unreachable?",
    "etcd answers lease renewals again",
);

/// Renews the lease every `renew_every` over a keepalive stream, reopening the
/// stream whenever it fails or an answer is late; reports each outcome.
pub(super) async fn renew_lease(
    client: Client,
    id: i64,
    timing: Timing,
    granted_at: Instant,
    state: watch::Sender<LeaseState>,
    stop: CancellationToken,
) {
    let round_trip = metrics::histogram!(m::KEEPALIVE_SECONDS);
    // However the renewals end, the lease no longer keeps a failure going.
    let place = id as u64;
    let _forget = scopeguard(move || RENEWALS_FAILED.forget_on(place));
    let mut retry = Backoff::new(Duration::from_millis(20), timing.renew_every / 2);
    let mut lease_client = client.lease_client();
    let renewed = |sent: Instant| {
        round_trip.record(sent.elapsed().as_secs_f64());
        if let Some(said) = RENEWALS_FAILED.recovered_on(place) {
            tracing::info!(lease = id, "{said}");
        }
        state.send_replace(LeaseState {
            contact: Contact::Renewed,
            deadline: timing.deadline(sent),
            in_flight: false,
        });
    };
    let sending = || {
        state.send_if_modified(|s| {
            s.in_flight = true;
            false
        });
    };
    let unreachable = |why: &dyn std::fmt::Display| {
        match RENEWALS_FAILED.failed_on(place) {
            Some(said) => tracing::warn!(lease = id, error = %why, "{said}"),
            None => tracing::debug!(lease = id, error = %why, "lease renewal failed again"),
        }
        state.send_if_modified(|s| {
            s.in_flight = false;
            if s.contact == Contact::Unreachable {
                return false;
            }
            s.contact = Contact::Unreachable;
            true
        });
    };
    let gone = || {
        tracing::warn!(lease = id, "etcd says the lease does not exist any more");
        state.send_modify(|s| {
            s.contact = Contact::Gone;
            s.in_flight = false;
        });
    };

    let mut next = granted_at + timing.renew_every;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        // Opening the stream sends a renewal and waits for its answer.
        let sent = Instant::now();
        sending();
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(timing.renew_every, lease_client.keep_alive(id)) => r,
        };
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(pair)) => {
                retry.reset();
                renewed(sent);
                pair
            }
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(e))) if e.contains("not found") => {
                gone();
                return;
            }
            Ok(Err(e)) => {
                unreachable(&readable(&e));
                next = Instant::now() + retry.next_delay();
                continue;
            }
            Err(_) => {
                unreachable(&format_args!("no answer within {:?}", timing.renew_every));
                next = Instant::now();
                continue;
            }
        };
        let mut last_sent = sent;
        loop {
            next = last_sent + timing.renew_every;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            let sent = Instant::now();
            sending();
            if let Err(e) = keeper.keep_alive().await {
                unreachable(&readable(&e));
                next = Instant::now();
                break;
            }
            let answer = tokio::select! {
                _ = stop.cancelled() => return,
                r = tokio::time::timeout(timing.renew_every, stream.message()) => r,
            };
            match answer {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                    renewed(sent);
                    last_sent = sent;
                }
                Ok(Ok(Some(_))) => {
                    gone();
                    return;
                }
                Ok(Ok(None)) => {
                    unreachable(&"keepalive stream closed");
                    next = Instant::now() + retry.next_delay();
                    break;
                }
                Ok(Err(e)) => {
                    unreachable(&readable(&e));
                    next = Instant::now() + retry.next_delay();
                    break;
                }
                Err(_) => {
                    unreachable(&format_args!("no answer within {:?}", timing.renew_every));
                    next = Instant::now();
                    break;
                }
            }
        }
    }
}

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_timing(ttl_ms: u64, renew_every_ms: u64, margin_ms: u64) {
        let t = Timing::new(Duration::from_millis(ttl_ms));
        assert_eq!(
            t.renew_every.as_millis(),
            renew_every_ms.into(),
            "renew_every for {ttl_ms}ms"
        );
        assert_eq!(
            t.margin.as_millis(),
            margin_ms.into(),
            "margin for {ttl_ms}ms"
        );
        // A renewal that got no answer is declared failed (after renew_every)
        // before the deadline the previous renewal set.
        assert!(
            t.renew_every * 2 < t.ttl - t.margin,
            "{ttl_ms}ms: the deadline comes too early"
        );
    }

    #[test]
    fn timings_follow_the_ttl() {
        check_timing(2_000, 666, 500);
        check_timing(3_000, 1_000, 750);
        check_timing(6_000, 2_000, 1_000);
        check_timing(60_000, 20_000, 1_000);
    }

    #[test]
    fn the_deadline_counts_from_when_the_renewal_was_sent() {
        let t = Timing::new(Duration::from_secs(6));
        let sent = Instant::now();
        assert_eq!(t.deadline(sent), sent + Duration::from_secs(5));
    }

    #[track_caller]
    fn check_deadline(contact: Contact, in_flight: bool, failsafe: bool, expected: AtDeadline) {
        let state = LeaseState {
            contact,
            deadline: Instant::now(),
            in_flight,
        };
        assert_eq!(
            at_deadline(state, failsafe),
            expected,
            "{contact:?}, in flight {in_flight}, failsafe {failsafe}"
        );
    }

    #[test]
    fn only_an_unreachable_etcd_under_failsafe_keeps_a_leader_past_its_deadline() {
        use AtDeadline::*;
        use Contact::*;
        for in_flight in [false, true] {
            check_deadline(Unreachable, in_flight, true, KeepLeading);
            check_deadline(Unreachable, in_flight, false, StepDown);
            check_deadline(Gone, in_flight, true, StepDown);
            check_deadline(Gone, in_flight, false, StepDown);
        }
        check_deadline(Renewed, false, true, StepDown);
        check_deadline(Renewed, false, false, StepDown);
    }

    #[test]
    fn a_renewal_still_out_at_the_deadline_is_waited_for() {
        check_deadline(Contact::Renewed, true, true, AtDeadline::AwaitRenewal);
        check_deadline(Contact::Renewed, true, false, AtDeadline::AwaitRenewal);
    }

    #[track_caller]
    fn check_ttl(ttl: &str, seconds: i64) {
        assert_eq!(
            ttl_seconds(humantime::parse_duration(ttl).unwrap()),
            seconds,
            "{ttl}"
        );
    }

    #[test]
    fn lease_ttls_round_up_to_whole_seconds() {
        check_ttl("2s", 2);
        check_ttl("6s", 6);
        check_ttl("2500ms", 3);
        check_ttl("1ms", 1);
    }
}
