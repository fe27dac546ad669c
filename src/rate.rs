//! The forwarding rate limit (`forwarder.max_rate`): one token bucket a term's
//! shard loops share. A loop takes up to a batch of permits before each forward
//! call and gives back what the call did not use, so the backlog after an outage
//! drains at the limit, each shard in due order, and nothing is skipped.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most permits the bucket holds: this much time's worth of the rate, so that a
/// limited drain comes in small, even steps rather than bursts.
const BURST: Duration = Duration::from_millis(50);

/// A token bucket refilled at `rate` permits a second (0: no limit).
pub struct Limiter {
    bucket: Mutex<Bucket>,
    /// Loops waiting for permits wait in turn (first come, first served), so that
    /// at a low rate no loop starves while others take and give back permits.
    turns: tokio::sync::Mutex<()>,
}

/// Longest single wait for a permit, so that a reload that raises the rate is
/// seen soon.
const MAX_WAIT: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct Bucket {
    rate: u64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn capacity(&self) -> f64 {
        (self.rate as f64 * BURST.as_secs_f64()).max(1.0)
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate as f64).min(self.capacity());
        self.at = now;
    }
}

impl Limiter {
    pub fn new(rate: u64, now: Instant) -> Limiter {
        let mut bucket = Bucket {
            rate,
            tokens: 0.0,
            at: now,
        };
        bucket.tokens = bucket.capacity();
        Limiter {
            bucket: Mutex::new(bucket),
            turns: tokio::sync::Mutex::new(()),
        }
    }

    /// Changes the rate (a reload); the permits held stay, within the new capacity.
    pub fn set_rate(&self, rate: u64, now: Instant) {
        let mut b = self.bucket.lock().expect("limiter lock");
        if b.rate != rate {
            b.refill(now);
            b.rate = rate;
            b.tokens = b.tokens.min(b.capacity());
        }
    }

    pub fn rate(&self) -> u64 {
        self.bucket.lock().expect("limiter lock").rate
    }

    /// Takes up to `want` permits: Ok with how many (at least 1), or Err with how
    /// long until one is there.
    pub fn take(&self, want: usize, now: Instant) -> Result<usize, Duration> {
        let mut b = self.bucket.lock().expect("limiter lock");
        if b.rate == 0 {
            return Ok(want);
        }
        b.refill(now);
        if b.tokens < 1.0 {
            let missing = 1.0 - b.tokens;
            return Err(Duration::from_secs_f64(missing / b.rate as f64));
        }
        let taken = (b.tokens.floor() as usize).min(want).max(1);
        b.tokens -= taken as f64;
        Ok(taken)
    }

    /// Waits its turn, then until at least one permit is there; takes up to `want`.
    pub async fn acquire(&self, want: usize) -> usize {
        let _turn = self.turns.lock().await;
        loop {
            match self.take(want, Instant::now()) {
                Ok(n) => return n,
                Err(wait) => tokio::time::sleep(wait.min(MAX_WAIT)).await,
            }
        }
    }

    /// Returns permits a call took but did not use.
    pub fn give_back(&self, unused: usize) {
        let mut b = self.bucket.lock().expect("limiter lock");
        if b.rate != 0 {
            b.tokens = (b.tokens + unused as f64).min(b.capacity());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn no_limit_gives_what_is_asked() {
        let t = Instant::now();
        let l = Limiter::new(0, t);
        assert_eq!(l.take(10_000, t), Ok(10_000));
        assert_eq!(l.take(10_000, t), Ok(10_000));
    }

    #[test]
    fn a_full_bucket_holds_fifty_milliseconds_of_the_rate() {
        let t = Instant::now();
        let l = Limiter::new(1000, t);
        assert_eq!(l.take(200, t), Ok(50));
        // Empty: one permit comes a millisecond later.
        assert_eq!(l.take(200, t), Err(ms(1)));
        assert_eq!(l.take(200, t + ms(10)), Ok(10));
        // Idle for a while: still only a burst's worth.
        assert_eq!(l.take(200, t + ms(5_000)), Ok(50));
    }

    #[test]
    fn the_smallest_rate_gives_one_a_second() {
        let t = Instant::now();
        let l = Limiter::new(1, t);
        assert_eq!(l.take(200, t), Ok(1));
        assert_eq!(l.take(200, t), Err(ms(1000)));
        assert_eq!(l.take(200, t + ms(500)), Err(ms(500)));
        assert_eq!(l.take(200, t + ms(1000)), Ok(1));
    }

    #[test]
    fn unused_permits_come_back_and_a_reload_changes_the_rate() {
        let t = Instant::now();
        let l = Limiter::new(1000, t);
        assert_eq!(l.take(200, t), Ok(50));
        l.give_back(30);
        assert_eq!(l.take(200, t), Ok(30));
        l.set_rate(100_000, t);
        assert_eq!(l.take(10_000, t + ms(50)), Ok(5_000));
        l.set_rate(0, t + ms(50));
        assert_eq!(l.take(10_000, t + ms(50)), Ok(10_000));
        l.set_rate(10, t + ms(50));
        assert_eq!(l.take(10, t + ms(50)), Err(ms(100)));
    }

    #[test]
    fn over_a_second_the_rate_is_kept() {
        let t = Instant::now();
        let l = Limiter::new(10_000, t);
        let mut taken = 0;
        let mut now = t;
        while now < t + ms(1000) {
            match l.take(200, now) {
                Ok(n) => taken += n,
                Err(wait) => now += wait,
            }
        }
        // A second's refill plus the burst held at the start.
        assert!((10_000..=10_501).contains(&taken), "{taken}");
    }
}
