//! A sleep that ends within µs of its deadline, for the forward loops' waits for
//! the next due time.
//!
//! The runtime's timer counts whole milliseconds and rounds a deadline up to the
//! next one, so a loop woken by it forwards a message due at a millisecond one or
//! two milliseconds late. On Linux a [`Timer`] is a `timerfd` in the runtime's
//! event loop instead: the kernel wakes it to the µs, and the loop costs no thread
//! of its own. Elsewhere, or when the kernel refuses a `timerfd` (out of file
//! descriptors), it falls back to the runtime's timer.

use std::time::Duration;

/// One loop's timer: a loop re-arms it for each wait.
pub(crate) struct Timer {
    #[cfg(target_os = "linux")]
    fd: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
}

impl Timer {
    /// A timer for one loop; falls back to the runtime's timer when the kernel
    /// refuses one (logged once per loop at debug).
    pub(crate) fn new() -> Self {
        #[cfg(target_os = "linux")]
        {
            let fd = linux::open()
                .inspect_err(
                    |e| tracing::debug!(error = %e, "no timerfd: waits use the runtime's ms timer"),
                )
                .ok();
            Timer { fd }
        }
        #[cfg(not(target_os = "linux"))]
        Timer {}
    }

    /// Sleeps `wait`. Dropped before it ends (a wake-up won the race), the timer is
    /// set again by the next call, which an expiry left over from before cannot end.
    pub(crate) async fn sleep(&mut self, wait: Duration) {
        #[cfg(target_os = "linux")]
        if let Some(fd) = &self.fd {
            match linux::sleep(fd, wait).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "timerfd failed: waits use the runtime's ms timer");
                    self.fd = None;
                }
            }
        }
        tokio::time::sleep(wait).await;
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::os::fd::OwnedFd;
    use std::time::Duration;

    use rustix::time::{
        Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
        timerfd_settime,
    };
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;

    pub(super) fn open() -> io::Result<AsyncFd<OwnedFd>> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // SAFETY: the `OwnedFd` is moved into the `AsyncFd` and only closed when it is
        // dropped, so its descriptor stays open and the same for the `AsyncFd`'s life.
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(Into::into)
    }

    /// Reads the expirations counted so far; false when there were none.
    fn expired(fd: &OwnedFd) -> io::Result<bool> {
        let mut count = [0u8; 8];
        match rustix::io::read(fd, &mut count) {
            Ok(_) => Ok(true),
            Err(rustix::io::Errno::AGAIN) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) async fn sleep(fd: &AsyncFd<OwnedFd>, wait: Duration) -> io::Result<()> {
        if wait.is_zero() {
            return Ok(());
        }
        // Setting the timer also forgets the expiries of a wait that was given up
        // (the kernel resets their count), so they cannot end this one early.
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // A wait past what a timespec holds is a wait for ever, as good as a year.
        let value = Timespec::try_from(wait).unwrap_or(Timespec {
            tv_sec: 365 * 86_400,
            tv_nsec: 0,
        });
        timerfd_settime(
            fd.get_ref(),
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: zero,
                it_value: value,
            },
        )?;
        loop {
            let mut ready = fd.readable().await?;
            if expired(fd.get_ref())? {
                return Ok(());
            }
            ready.clear_ready();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// Never early, whatever the wait; how close to its end it wakes is the spread
    /// bench's lateness (a test on a shared machine only bounds it grossly).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sleep_never_ends_early() {
        let mut timer = Timer::new();
        #[cfg(target_os = "linux")]
        assert!(timer.fd.is_some(), "this kernel gives a timerfd");
        for wait_us in [0, 1, 300, 999, 1_000, 1_001, 2_700, 5_000, 12_345] {
            let wait = Duration::from_micros(wait_us);
            let start = Instant::now();
            timer.sleep(wait).await;
            let slept = start.elapsed();
            assert!(slept >= wait, "{wait_us} µs: slept only {slept:?}");
            assert!(
                slept < wait + Duration::from_secs(1),
                "{wait_us} µs: slept {slept:?}"
            );
        }
    }

    /// A wait given up before its end (its future dropped) neither ends the next
    /// one early nor keeps it from ending.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_given_up_leaves_the_next_whole() {
        let mut timer = Timer::new();
        let short = Duration::from_millis(5);
        let given_up = tokio::time::timeout(Duration::from_millis(1), timer.sleep(short)).await;
        assert!(given_up.is_err(), "a 5 ms sleep outlasts a 1 ms timeout");
        // The given-up wait expires while nobody waits on it.
        std::thread::sleep(Duration::from_millis(10));
        let wait = Duration::from_millis(20);
        let start = Instant::now();
        timer.sleep(wait).await;
        let slept = start.elapsed();
        assert!(slept >= wait, "slept only {slept:?} of {wait:?}");
        assert!(slept < wait + Duration::from_secs(1), "slept {slept:?}");
    }
}
