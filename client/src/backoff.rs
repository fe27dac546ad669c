//! Jittered exponential backoff for loops that must not die on an error.

use std::time::Duration;

use rand::Rng;

#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            current: min,
        }
    }

    /// The next delay: doubling up to `max`, with ±25% jitter so that several
    /// instances do not retry in step.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.current;
        self.current = (self.current * 2).min(self.max);
        let jitter = rand::rng().random_range(0.75..1.25);
        base.mul_f64(jitter)
    }

    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
        assert!(delays[0] >= Duration::from_millis(75) && delays[0] <= Duration::from_millis(125));
        assert!(
            delays[7] >= Duration::from_millis(750) && delays[7] <= Duration::from_millis(1250)
        );
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(125));
    }
}
