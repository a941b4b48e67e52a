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

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
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
