//! The median of repeated timings: robust against the odd run slowed down by other work on
//! a shared machine, which a mean is not.

use std::time::Duration;

/// The median of `samples` (the mean of the two middle ones for an even count).
pub fn median(samples: &[Duration]) -> Option<Duration> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let mid = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[mid]),
        _ => Some((sorted[mid - 1] + sorted[mid]) / 2),
    }
}

/// The `q`-quantile (0.0-1.0) of `samples`, nearest-rank: the smallest sample with at least
/// `q` of all samples at or below it.
pub fn quantile(samples: &[Duration], q: f64) -> Option<Duration> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.saturating_sub(1).min(sorted.len().saturating_sub(1)))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&samples, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(quantile(&samples, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(quantile(&samples, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(quantile(&ms(&[7]), 0.99), Some(Duration::from_millis(7)));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn median_ignores_outliers_and_order() {
        assert_eq!(
            median(&ms(&[30, 10, 900, 20, 25])),
            Some(Duration::from_millis(25))
        );
        assert_eq!(median(&ms(&[40, 10])), Some(Duration::from_millis(25)));
        assert_eq!(median(&[]), None);
    }
}
