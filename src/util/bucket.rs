//! A token bucket: the client's request rate limit (as client-go's), and events published at
//! most so often (as upstream's recorder limits its `Nominated` events).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A token bucket: `rate` tokens a second, holding at most `capacity`.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    capacity: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket; a zero `rate` never makes anyone wait.
    pub fn new(rate: u32, capacity: u32) -> Self {
        let capacity = f64::from(capacity.max(1));
        TokenBucket { rate: f64::from(rate), capacity, state: Mutex::new((capacity, Instant::now())) }
    }

    /// Takes a token, reserving one ahead when the bucket is empty, and returns how long to wait
    /// before using it.
    pub fn reserve(&self) -> Duration {
        self.reserve_at(Instant::now())
    }

    fn reserve_at(&self, now: Instant) -> Duration {
        if self.rate <= 0.0 {
            return Duration::ZERO;
        }
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (tokens, last) = *state;
        let refilled =
            (tokens + now.saturating_duration_since(last).as_secs_f64() * self.rate).min(self.capacity);
        let left = refilled - 1.0;
        *state = (left, now);
        if left >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-left / self.rate) }
    }

    /// Takes a token if one is there, reserving none ahead: whether it was (a zero `rate` always
    /// has one). What is refused is dropped, as client-go's `TryAccept`.
    pub fn try_take(&self) -> bool {
        self.try_take_at(Instant::now())
    }

    fn try_take_at(&self, now: Instant) -> bool {
        if self.rate <= 0.0 {
            return true;
        }
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (tokens, last) = *state;
        let refilled =
            (tokens + now.saturating_duration_since(last).as_secs_f64() * self.rate).min(self.capacity);
        let taken = refilled >= 1.0;
        *state = (if taken { refilled - 1.0 } else { refilled }, now);
        taken
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let bucket = TokenBucket::new(10, 3);
        let t0 = bucket.state.lock().unwrap().1;
        for _ in 0..3 {
            assert_eq!(bucket.reserve_at(t0), Duration::ZERO);
        }
        // Empty: the next tokens come every 100 ms, reserved in order.
        assert_eq!(bucket.reserve_at(t0), Duration::from_millis(100));
        assert_eq!(bucket.reserve_at(t0), Duration::from_millis(200));
        // 250 ms later the two reservations are paid and half a token has come back.
        assert_eq!(bucket.reserve_at(t0 + Duration::from_millis(250)), Duration::from_millis(50));
        // Ten seconds later it is full again, but never beyond the burst.
        let later = t0 + Duration::from_secs(10);
        for _ in 0..3 {
            assert_eq!(bucket.reserve_at(later), Duration::ZERO);
        }
        assert_eq!(bucket.reserve_at(later), Duration::from_millis(100));
    }

    #[test]
    fn zero_qps_means_no_limit() {
        let bucket = TokenBucket::new(0, 0);
        for _ in 0..1000 {
            assert_eq!(bucket.reserve(), Duration::ZERO);
        }
    }

    #[test]
    fn a_try_takes_what_is_there_and_reserves_nothing() {
        let bucket = TokenBucket::new(5, 2);
        let t0 = bucket.state.lock().unwrap().1;
        assert!(bucket.try_take_at(t0));
        assert!(bucket.try_take_at(t0));
        assert!(!bucket.try_take_at(t0), "the burst is spent");
        assert!(!bucket.try_take_at(t0 + Duration::from_millis(150)), "three quarters of a token");
        // The refused tries took nothing: the token is whole 200 ms after the burst.
        assert!(bucket.try_take_at(t0 + Duration::from_millis(200)));
        assert!(!bucket.try_take_at(t0 + Duration::from_millis(200)));
        assert!(TokenBucket::new(0, 0).try_take(), "no rate, no limit");
    }
}
