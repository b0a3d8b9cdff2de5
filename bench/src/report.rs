//! Reporting: percentile summaries, number formats and markdown tables.

use std::fmt;

use hdrhistogram::Histogram;

/// Percentiles of a latency histogram recorded in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Median, µs.
    pub p50: u64,
    /// 90th percentile, µs.
    pub p90: u64,
    /// 99th percentile, µs.
    pub p99: u64,
    /// 99.9th percentile, µs.
    pub p999: u64,
    /// Largest sample, µs.
    pub max: u64,
}

impl Percentiles {
    /// Summarizes `h` (values in µs).
    pub fn of(h: &Histogram<u64>) -> Self {
        Self {
            count: h.len(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// Percentiles of a set of samples kept whole (nearest rank: the
/// smallest sample at or above the quantile), in the samples' own unit.
/// Unlike [`Percentiles`] nothing is rounded to a histogram bucket, and
/// samples may be negative (the span between two processes' points in time
/// that nearly coincide).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dist {
    sorted: Vec<f64>,
}

impl Dist {
    /// The distribution of `samples`.
    pub fn of(samples: impl IntoIterator<Item = f64>) -> Self {
        let mut sorted: Vec<f64> = samples.into_iter().collect();
        sorted.sort_by(f64::total_cmp);
        Self { sorted }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// True without samples.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The `q` quantile (`0.0..=1.0`); 0 without samples.
    pub fn quantile(&self, q: f64) -> f64 {
        let n = self.sorted.len();
        if n == 0 {
            return 0.0;
        }
        let rank = (q * n as f64).ceil() as usize;
        self.sorted[rank.clamp(1, n) - 1]
    }

    /// Median.
    pub fn p50(&self) -> f64 {
        self.quantile(0.50)
    }

    /// 90th percentile.
    pub fn p90(&self) -> f64 {
        self.quantile(0.90)
    }

    /// 95th percentile.
    pub fn p95(&self) -> f64 {
        self.quantile(0.95)
    }

    /// 99th percentile.
    pub fn p99(&self) -> f64 {
        self.quantile(0.99)
    }

    /// Largest sample; 0 without samples.
    pub fn max(&self) -> f64 {
        self.sorted.last().copied().unwrap_or(0.0)
    }

    /// Mean; 0 without samples.
    pub fn mean(&self) -> f64 {
        self.sorted.iter().sum::<f64>() / self.sorted.len().max(1) as f64
    }
}

/// The median of `values` (the mean of the middle two for an even count);
/// NaN without values.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let v = Dist::of(values).sorted;
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Microseconds as milliseconds with two decimals (`"1.23"`).
pub fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// Nanoseconds as milliseconds to about three figures: no decimal from
/// 100 ms, one from 10 ms, else two (`"123"`, `"12.3"`, `"1.23"`).
pub fn ms_of_ns(ns: f64) -> String {
    let v = ns / 1e6;
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A target's verdict cell: `met` or a bold `not met`.
pub fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**not met**" }
}

/// KiB as MiB with one decimal (`"23.4"`).
pub fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// A rate with thousands separators and no decimals (`"12,345"`).
pub fn rate(per_sec: f64) -> String {
    thousands(per_sec.round().max(0.0) as u64)
}

/// An integer with thousands separators (`"50,000"`).
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A markdown table.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    /// Indices of the columns aligned right (`---:`).
    right: Vec<usize>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self {
            header: header.into_iter().map(Into::into).collect(),
            right: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// Aligns these columns (0-based) right, as numbers are.
    pub fn right(mut self, columns: impl IntoIterator<Item = usize>) -> Self {
        self.right.extend(columns);
        self
    }

    /// Appends a row.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// True when no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// One line of a table; an empty cell is written `| |`.
fn line(f: &mut fmt::Formatter<'_>, cells: &[String]) -> fmt::Result {
    f.write_str("|")?;
    for cell in cells {
        if cell.is_empty() {
            f.write_str(" |")?;
        } else {
            write!(f, " {cell} |")?;
        }
    }
    writeln!(f)
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        line(f, &self.header)?;
        writeln!(
            f,
            "|{}|",
            (0..self.header.len())
                .map(|i| if self.right.contains(&i) {
                    "---:"
                } else {
                    "---"
                })
                .collect::<Vec<_>>()
                .join("|")
        )?;
        for row in &self.rows {
            line(f, row)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(ms(1234), "1.23");
        assert_eq!(mib(2048), "2.0");
        let mut t = Table::new(["a", "b"]);
        t.row(["1", "2"]);
        assert_eq!(t.to_string(), "| a | b |\n|---|---|\n| 1 | 2 |\n");
        let mut t = Table::new(["a", "b", "c"]).right([1, 2]);
        t.row(["x", "", "z"]);
        assert_eq!(
            t.to_string(),
            "| a | b | c |\n|---|---:|---:|\n| x | | z |\n"
        );
        assert_eq!(ms_of_ns(123_456_789.0), "123");
        assert_eq!(ms_of_ns(12_345_678.0), "12.3");
        assert_eq!(ms_of_ns(-1_234_567.0), "-1.23");
        assert_eq!(verdict(false), "**not met**");
    }

    #[test]
    fn distributions() {
        let d = Dist::of((1..=200).rev().map(f64::from));
        assert_eq!(d.len(), 200);
        assert_eq!(
            (d.p50(), d.p95(), d.p99(), d.max()),
            (100.0, 190.0, 198.0, 200.0)
        );
        assert_eq!(d.mean(), 100.5);
        let empty = Dist::of([]);
        assert!(empty.is_empty());
        assert_eq!((empty.p50(), empty.max(), empty.mean()), (0.0, 0.0, 0.0));
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median([]).is_nan());
    }

    #[test]
    fn percentiles_of_a_histogram() {
        let mut h = crate::load::latency_histogram();
        for v in 1..=1000 {
            h.record(v).expect("in range");
        }
        let p = Percentiles::of(&h);
        assert_eq!(p.count, 1000);
        assert!((495..=505).contains(&p.p50));
        assert!((985..=995).contains(&p.p99));
        assert_eq!(p.max, 1000);
    }
}
