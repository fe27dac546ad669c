//! The forwarding rate limit (`forwarder.max_rate`): one token bucket a term's
//! shard loops share. A loop takes up to a batch of permits before each forward
//! call and gives back what the call did not use, so the backlog after an outage
//! drains at the limit, each shard in due order, and nothing is skipped.
//!
//! Per-stream limits (`streams.max_rate`) are buckets too ([`StreamLimits`]): before
//! each call a loop takes what each limited stream's bucket holds, up to a batch, as
//! that stream's budget; the forward script holds back that stream's due messages
//! beyond it (see `store::forward_at_most`), and the loop gives back what the
//! stream did not take.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
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
    /// Permits a second; fractional for a group leader's share (0: no limit).
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn capacity(&self) -> f64 {
        (self.rate * BURST.as_secs_f64()).max(1.0)
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity());
        self.at = now;
    }
}

impl Limiter {
    pub fn new(rate: f64, now: Instant) -> Limiter {
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
    pub fn set_rate(&self, rate: f64, now: Instant) {
        let mut b = self.bucket.lock().expect("limiter lock");
        if b.rate != rate {
            b.refill(now);
            b.rate = rate;
            b.tokens = b.tokens.min(b.capacity());
        }
    }

    pub fn rate(&self) -> f64 {
        self.bucket.lock().expect("limiter lock").rate
    }

    /// Takes up to `want` permits: Ok with how many (at least 1), or Err with how
    /// long until one is there.
    pub fn take(&self, want: usize, now: Instant) -> Result<usize, Duration> {
        let mut b = self.bucket.lock().expect("limiter lock");
        if b.rate == 0.0 {
            return Ok(want);
        }
        b.refill(now);
        if b.tokens < 1.0 {
            let missing = 1.0 - b.tokens;
            return Err(Duration::from_secs_f64(missing / b.rate));
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
        if b.rate != 0.0 {
            b.tokens = (b.tokens + unused as f64).min(b.capacity());
        }
    }
}

impl Limiter {
    /// How long until the bucket holds a permit (zero if it does, or without a limit).
    pub fn until_permit(&self, now: Instant) -> Duration {
        let mut b = self.bucket.lock().expect("limiter lock");
        if b.rate == 0.0 {
            return Duration::ZERO;
        }
        b.refill(now);
        if b.tokens >= 1.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((1.0 - b.tokens) / b.rate)
    }
}

/// One bucket per stream with a limit, shared by a term's shard loops.
#[derive(Default)]
pub struct StreamLimits {
    streams: RwLock<BTreeMap<String, Arc<Limiter>>>,
}

impl StreamLimits {
    pub fn new(rates: &[(String, f64)], now: Instant) -> StreamLimits {
        let limits = StreamLimits::default();
        limits.set_rates(rates, now);
        limits
    }

    /// Applies a (reloaded) configuration: new streams get a full bucket, changed
    /// ones keep their permits within the new capacity, streams no longer listed
    /// lose their limit.
    pub fn set_rates(&self, rates: &[(String, f64)], now: Instant) {
        let mut streams = self.streams.write().expect("stream limits lock");
        streams.retain(|stream, _| rates.iter().any(|(s, _)| s == stream));
        for (stream, rate) in rates {
            match streams.get(stream) {
                Some(limiter) => limiter.set_rate(*rate, now),
                None => {
                    streams.insert(stream.clone(), Arc::new(Limiter::new(*rate, now)));
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.streams.read().expect("stream limits lock").is_empty()
    }

    /// The limited streams and their rates.
    pub fn rates(&self) -> Vec<(String, f64)> {
        let streams = self.streams.read().expect("stream limits lock");
        streams.iter().map(|(s, l)| (s.clone(), l.rate())).collect()
    }

    /// Takes up to `want` permits from every stream's bucket: each stream's budget
    /// for one forward call (0 while its bucket is empty).
    pub fn take_budgets(&self, want: usize, now: Instant) -> Vec<(String, usize)> {
        let streams = self.streams.read().expect("stream limits lock");
        streams
            .iter()
            .map(|(stream, limiter)| (stream.clone(), limiter.take(want, now).unwrap_or(0)))
            .collect()
    }

    /// Gives back what each stream did not use of its budget (`sent`: messages the
    /// call forwarded to each stream).
    pub fn give_back(&self, budgets: &[(String, usize)], sent: &[(String, u64)]) {
        let streams = self.streams.read().expect("stream limits lock");
        for (stream, budget) in budgets {
            let used = sent
                .iter()
                .find(|(s, _)| s == stream)
                .map_or(0, |(_, n)| *n as usize);
            if let Some(limiter) = streams.get(stream) {
                limiter.give_back(budget.saturating_sub(used));
            }
        }
    }

    /// How long until the first of `streams` (those holding messages back) has a
    /// permit; None when none of them is limited any more.
    pub fn until_permit<'a>(
        &self,
        streams: impl IntoIterator<Item = &'a str>,
        now: Instant,
    ) -> Option<Duration> {
        let limits = self.streams.read().expect("stream limits lock");
        streams
            .into_iter()
            .filter_map(|s| limits.get(s).map(|l| l.until_permit(now)))
            .min()
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
        let l = Limiter::new(0.0, t);
        assert_eq!(l.take(10_000, t), Ok(10_000));
        assert_eq!(l.take(10_000, t), Ok(10_000));
    }

    #[test]
    fn a_full_bucket_holds_fifty_milliseconds_of_the_rate() {
        let t = Instant::now();
        let l = Limiter::new(1000.0, t);
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
        let l = Limiter::new(1.0, t);
        assert_eq!(l.take(200, t), Ok(1));
        assert_eq!(l.take(200, t), Err(ms(1000)));
        assert_eq!(l.take(200, t + ms(500)), Err(ms(500)));
        assert_eq!(l.take(200, t + ms(1000)), Ok(1));
    }

    #[test]
    fn unused_permits_come_back_and_a_reload_changes_the_rate() {
        let t = Instant::now();
        let l = Limiter::new(1000.0, t);
        assert_eq!(l.take(200, t), Ok(50));
        l.give_back(30);
        assert_eq!(l.take(200, t), Ok(30));
        l.set_rate(100_000.0, t);
        assert_eq!(l.take(10_000, t + ms(50)), Ok(5_000));
        l.set_rate(0.0, t + ms(50));
        assert_eq!(l.take(10_000, t + ms(50)), Ok(10_000));
        l.set_rate(10.0, t + ms(50));
        assert_eq!(l.take(10, t + ms(50)), Err(ms(100)));
    }

    #[test]
    fn over_a_second_the_rate_is_kept() {
        let t = Instant::now();
        let l = Limiter::new(10_000.0, t);
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

    #[test]
    fn stream_limits_give_each_stream_its_own_budget_and_follow_reloads() {
        let t = Instant::now();
        let limits = StreamLimits::new(&[("a".into(), 1000.0), ("b".into(), 20.0)], t);
        let budgets = limits.take_budgets(200, t);
        assert_eq!(budgets, vec![("a".into(), 50), ("b".into(), 1)]);
        // a sent 10, b none: the rest comes back.
        limits.give_back(&budgets, &[("a".into(), 10), ("other".into(), 99)]);
        assert_eq!(
            limits.take_budgets(200, t),
            vec![("a".into(), 40), ("b".into(), 1)]
        );
        assert_eq!(
            limits.take_budgets(200, t),
            vec![("a".into(), 0), ("b".into(), 0)]
        );
        assert_eq!(limits.until_permit(["a", "b"], t), Some(ms(1)));
        assert_eq!(limits.until_permit(["b"], t), Some(ms(50)));
        assert_eq!(limits.until_permit(["c"], t), None);
        // A reload drops b's limit, keeps a's permits and adds c.
        limits.set_rates(&[("a".into(), 1000.0), ("c".into(), 1.0)], t);
        assert_eq!(
            limits.rates(),
            vec![("a".into(), 1000.0), ("c".into(), 1.0)]
        );
        assert_eq!(
            limits.take_budgets(200, t),
            vec![("a".into(), 0), ("c".into(), 1)]
        );
        limits.set_rates(&[], t);
        assert!(limits.is_empty());
    }
}
