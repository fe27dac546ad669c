//! A sleep that ends within µs of its deadline, for the forward loops' waits for
//! the next due time.
//!
//! The runtime's timer counts whole milliseconds and rounds a deadline up to the
//! next one, so a loop woken by it forwards a message due at a millisecond one or
//! two milliseconds late. On Linux a [`Timer`] is a `timerfd` in the runtime's
//! event loop instead: the kernel wakes it to the µs, and the loop costs no thread
//! of its own. Elsewhere, past [`MAX_PRECISE`] timers, or when the kernel refuses
//! a `timerfd`, it falls back to the runtime's timer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Most `timerfd`s open at once in the process: on Redis Cluster a term runs a loop
/// per hash slot in use, up to 16384, and each descriptor counts against the
/// process's limit that connections and the HTTP listener need too. Loops past it
/// wait on the runtime's timer, a millisecond or two coarser.
pub(crate) const MAX_PRECISE: usize = 256;

/// The `timerfd`s open now, against [`MAX_PRECISE`].
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// One loop's timer: a loop sets it again for each wait.
pub(crate) struct Timer {
    #[cfg(target_os = "linux")]
    fd: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    /// The count its `timerfd` is held against (the process's, or a test's).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    open: &'static AtomicUsize,
}

impl Timer {
    /// A timer for one loop: precise while fewer than [`MAX_PRECISE`] are open.
    pub(crate) fn new() -> Self {
        Self::counted(&OPEN, MAX_PRECISE)
    }

    fn counted(open: &'static AtomicUsize, max: usize) -> Self {
        #[cfg(target_os = "linux")]
        {
            if open.fetch_add(1, Ordering::Relaxed) >= max {
                open.fetch_sub(1, Ordering::Relaxed);
                return Timer { fd: None, open };
            }
            let fd = match linux::open() {
                Ok(fd) => Some(fd),
                Err(e) => {
                    open.fetch_sub(1, Ordering::Relaxed);
                    tracing::debug!(error = %e, "no timerfd: this loop waits on the runtime's ms timer");
                    None
                }
            };
            Timer { fd, open }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = max;
            Timer { open }
        }
    }

    /// Sleeps `wait`. Dropped before it ends (a wake-up won the race), the timer is
    /// set again by the next call, which an expiry left over from before cannot end.
    pub(crate) async fn sleep(&mut self, wait: Duration) {
        #[cfg(target_os = "linux")]
        if let Some(fd) = &self.fd {
            match linux::sleep(fd, wait).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "timerfd failed: this loop waits on the runtime's ms timer");
                    self.fd = None;
                    self.open.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        tokio::time::sleep(wait).await;
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.fd.is_some() {
            self.open.fetch_sub(1, Ordering::Relaxed);
        }
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::time::Instant;

    use futures::FutureExt;

    use super::*;

    /// Never early, whatever the wait; how close to its end it wakes is the spread
    /// bench's lateness (a test on a shared machine only bounds it grossly).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sleep_never_ends_early() {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let mut timer = Timer::counted(&COUNT, 1);
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

    /// A wait given up before its end (its future dropped after one poll) neither
    /// ends the next one early nor keeps it from ending.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_given_up_leaves_the_next_whole() {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let mut timer = Timer::counted(&COUNT, 1);
        let given_up = timer.sleep(Duration::from_millis(50)).now_or_never();
        assert!(
            given_up.is_none(),
            "a 50 ms sleep is not over at its first poll"
        );
        // The given-up wait expires while nobody waits on it.
        std::thread::sleep(Duration::from_millis(80));
        let wait = Duration::from_millis(20);
        let start = Instant::now();
        timer.sleep(wait).await;
        let slept = start.elapsed();
        assert!(slept >= wait, "slept only {slept:?} of {wait:?}");
        assert!(slept < wait + Duration::from_secs(1), "slept {slept:?}");
    }

    /// Past the cap a timer is the runtime's, still never early; each one dropped
    /// gives its place back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn past_the_cap_a_timer_falls_back_and_a_dropped_one_frees_its_place() {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let held: Vec<Timer> = (0..3).map(|_| Timer::counted(&COUNT, 3)).collect();
        assert_eq!(COUNT.load(Ordering::Relaxed), 3);
        let mut coarse = Timer::counted(&COUNT, 3);
        assert!(held.iter().all(|t| t.fd.is_some()));
        assert!(coarse.fd.is_none(), "the fourth of three is the runtime's");
        assert_eq!(COUNT.load(Ordering::Relaxed), 3);
        let start = Instant::now();
        coarse.sleep(Duration::from_millis(3)).await;
        assert!(start.elapsed() >= Duration::from_millis(3));
        drop(coarse);
        assert_eq!(
            COUNT.load(Ordering::Relaxed),
            3,
            "a coarse timer held no place"
        );
        drop(held);
        assert_eq!(COUNT.load(Ordering::Relaxed), 0);
        let again = Timer::counted(&COUNT, 3);
        assert!(again.fd.is_some());
        assert_eq!(COUNT.load(Ordering::Relaxed), 1);
    }
}
