//! Reporting: percentile summaries and markdown tables.

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

/// Microseconds as milliseconds with two decimals (`"1.23"`).
pub fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
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
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
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

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| {} |", self.header.join(" | "))?;
        writeln!(
            f,
            "|{}|",
            self.header
                .iter()
                .map(|_| "---")
                .collect::<Vec<_>>()
                .join("|")
        )?;
        for row in &self.rows {
            writeln!(f, "| {} |", row.join(" | "))?;
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
