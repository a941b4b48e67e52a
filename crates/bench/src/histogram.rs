//! A Prometheus histogram read off a `/metrics` page, and its quantiles computed the way
//! Prometheus' `histogram_quantile` computes them: linear interpolation inside the bucket
//! holding the rank. A dashboard over the proxy's metric shows the same figure as the report.
//!
//! Only the cumulative bucket counts travel; a quantile is an estimate whose resolution is the
//! bucket width (why the programming-latency metric has fine buckets below 0.25 s).

/// The cumulative buckets of one series, in increasing `le` order, `+Inf` last.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    /// The series of `name` whose labels include every `(key, value)` of `labels`, from a
    /// text exposition; `None` when no bucket line matches.
    pub fn parse(exposition: &str, name: &str, labels: &[(&str, &str)]) -> Option<Self> {
        let prefix = format!("{name}_bucket{{");
        let mut buckets: Vec<(f64, u64)> = exposition
            .lines()
            .filter_map(|line| {
                let (label_text, value) = line.strip_prefix(&prefix)?.split_once("} ")?;
                let pairs = label_pairs(label_text);
                let wanted = labels
                    .iter()
                    .all(|(k, v)| pairs.iter().any(|(pk, pv)| pk == k && pv == v));
                if !wanted {
                    return None;
                }
                let le = pairs.iter().find(|(k, _)| *k == "le")?.1;
                Some((parse_bound(le)?, value.trim().parse::<f64>().ok()? as u64))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        (!buckets.is_empty()).then_some(Self { buckets })
    }

    /// How many observations the series holds (the `+Inf` bucket).
    pub fn count(&self) -> u64 {
        self.buckets.last().map_or(0, |(_, n)| *n)
    }

    /// The `q`-quantile (0-1) as `histogram_quantile` estimates it: the rank `q × count` is
    /// located in the first bucket whose cumulative count reaches it, and the value is
    /// interpolated linearly between that bucket's lower and upper bound (the lower bound of
    /// the first bucket is 0). A rank in the `+Inf` bucket gives the highest finite bound.
    /// `None` without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * count as f64;
        let position = self.buckets.iter().position(|(_, n)| *n as f64 >= rank)?;
        let (upper, in_upper) = self.buckets[position];
        let (lower, below) = match position {
            0 => (0.0, 0),
            p => self.buckets[p - 1],
        };
        if upper.is_infinite() {
            return Some(lower);
        }
        if position == 0 && upper <= 0.0 {
            return Some(upper);
        }
        let in_bucket = in_upper.saturating_sub(below) as f64;
        if in_bucket == 0.0 {
            return Some(upper);
        }
        Some(lower + (upper - lower) * (rank - below as f64) / in_bucket)
    }
}

/// `le="0.1",ip_family="IPv4"` as pairs (label values here never hold `,` or `"`).
fn label_pairs(text: &str) -> Vec<(&str, &str)> {
    text.split(',')
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key.trim(), value.trim().strip_prefix('"')?.strip_suffix('"')?))
        })
        .collect()
}

fn parse_bound(le: &str) -> Option<f64> {
    match le {
        "+Inf" => Some(f64::INFINITY),
        finite => finite.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "kubeproxy_network_programming_duration_seconds";

    fn exposition() -> String {
        let mut text = format!("# TYPE {NAME} histogram\n");
        for (le, n) in [
            ("0.01", 10),
            ("0.05", 60),
            ("0.1", 90),
            ("0.25", 100),
            ("+Inf", 100),
        ] {
            text.push_str(&format!("{NAME}_bucket{{le=\"{le}\",ip_family=\"IPv4\"}} {n}\n"));
            text.push_str(&format!("{NAME}_bucket{{le=\"{le}\",ip_family=\"IPv6\"}} 1\n"));
        }
        text.push_str(&format!(
            "{NAME}_sum{{ip_family=\"IPv4\"}} 5.5\n{NAME}_count{{ip_family=\"IPv4\"}} 100\n"
        ));
        text
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn reads_one_series_by_its_labels() {
        let h = Histogram::parse(&exposition(), NAME, &[("ip_family", "IPv4")]).unwrap();
        assert_eq!(
            h.buckets,
            [
                (0.01, 10),
                (0.05, 60),
                (0.1, 90),
                (0.25, 100),
                (f64::INFINITY, 100)
            ]
        );
        assert_eq!(h.count(), 100);
        assert_eq!(
            Histogram::parse(&exposition(), NAME, &[("ip_family", "IPv6")]).map(|h| h.count()),
            Some(1)
        );
        assert_eq!(Histogram::parse(&exposition(), NAME, &[("ip_family", "x")]), None);
        assert_eq!(Histogram::parse(&exposition(), "other", &[]), None);
    }

    /// The figures `histogram_quantile` gives for these buckets.
    #[test]
    fn quantiles_interpolate_inside_the_bucket_like_prometheus() {
        let h = Histogram::parse(&exposition(), NAME, &[("ip_family", "IPv4")]).unwrap();
        // Rank 50 is the 40th of the 50 observations in (0.01, 0.05]: 0.01 + 0.04 × 40/50.
        assert!(close(h.quantile(0.5), 0.042), "{:?}", h.quantile(0.5));
        // Rank 99 is the 9th of 10 in (0.1, 0.25]: 0.1 + 0.15 × 9/10.
        assert!(close(h.quantile(0.99), 0.235), "{:?}", h.quantile(0.99));
        // In the first bucket the lower bound is 0: rank 5 of 10 in (0, 0.01].
        assert!(close(h.quantile(0.05), 0.005), "{:?}", h.quantile(0.05));
        // Rank 90 is exactly the top of (0.05, 0.1].
        assert!(close(h.quantile(0.9), 0.1), "{:?}", h.quantile(0.9));
    }

    #[test]
    fn a_rank_beyond_the_finite_buckets_gives_the_highest_finite_bound() {
        let h = Histogram {
            buckets: vec![(0.1, 50), (0.25, 60), (f64::INFINITY, 100)],
        };
        assert!(close(h.quantile(0.99), 0.25));
        let empty = Histogram {
            buckets: vec![(0.1, 0), (f64::INFINITY, 0)],
        };
        assert_eq!(empty.quantile(0.5), None);
    }
}
